"""numpy's 4-element f32 add, measured like examples/tiny_op.rs (thread CPU time and wall time
per op, median of 21 rounds of 200 000), for a side-by-side figure on the same machine."""

import time

import numpy as np

a = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
b = np.array([0.5] * 4, dtype=np.float32)
iterations, rounds = 200_000, 21
wall, cpu = [], []
for _ in range(rounds):
    w, c = time.perf_counter(), time.thread_time()
    for _ in range(iterations):
        a + b
    cpu.append((time.thread_time() - c) * 1e9 / iterations)
    wall.append((time.perf_counter() - w) * 1e9 / iterations)
print(
    "numpy add_f32_4: %.1f ns per op (thread CPU time), %.1f ns wall; median of %d rounds of %d"
    % (sorted(cpu)[rounds // 2], sorted(wall)[rounds // 2], rounds, iterations)
)
