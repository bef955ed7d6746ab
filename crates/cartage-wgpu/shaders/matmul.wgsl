// Tiled batched matrix product C[b] = A[b] × B[b] with A [M, K], B [K, N] at any strides and C
// contiguous. A workgroup computes a BM × BN tile of C with (BM/TM) × (BN/TN) invocations, each
// owning a TM × TN register block (rows and columns in groups of four, spread over the tile so
// that shared-memory reads and global stores are contiguous across neighbouring invocations).
// K advances BK at a time through workgroup memory (A transposed, B as is), and the next
// K-tile is fetched into registers while the current one is multiplied (double buffering).
// With STAGES = 2 the next K-tile is deposited into a second workgroup buffer while the other
// one is read, so that one barrier per K-tile suffices (`loop_two_stages`).
// Fast path: K-contiguous A and N-contiguous B are read four elements at a time (vec4).
// The register block is unrolled by the generator (ACC_DECL, INNER, STORE_ALL): one vec4
// variable per four columns of a row, so that it lives in registers on every compiler.
{{ENABLE}}

{{PRELUDE}}

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch_base: u32,
    a_off: u32,
    b_off: u32,
    c_off: u32,
    pad0: u32,
    a_sb: u32,
    a_sm: u32,
    a_sk: u32,
    pad1: u32,
    b_sb: u32,
    b_sk: u32,
    b_sn: u32,
    pad2: u32,
    c_sb: u32,
    c_sm: u32,
    pad3: u32,
    pad4: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

{{BINDINGS}}

{{ACCESSORS}}

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const TM: u32 = {{TM}}u;
const TN: u32 = {{TN}}u;
const WX: u32 = BN / TN;
const WY: u32 = BM / TM;
const THREADS: u32 = WX * WY;
const LA: u32 = {{LA}}u;
const LB: u32 = {{LB}}u;

const A_TILE: u32 = BK * BM / 4u;
const B_TILE: u32 = BK * BN / 4u;

var<workgroup> As: array<vec4<{{T}}>, {{STAGES}}u * A_TILE>;
var<workgroup> Bs: array<vec4<{{T}}>, {{STAGES}}u * B_TILE>;
var<private> ra: array<{{RA}}, LA>;
var<private> rb: array<{{RB}}, LB>;

// Global memory -> registers for the K-tile starting at k0.
fn fetch(k0: u32, a_base: u32, b_base: u32, row0: u32, col0: u32, lid: u32) {
    {{FETCH}}
}

// Registers -> workgroup memory, the A tile at `sa` and the B tile at `sb` (in vec4s).
fn deposit(lid: u32, sa: u32, sb: u32) {
    {{DEPOSIT}}
}

@compute @workgroup_size({{THREADS}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let batch = wid.z + P.batch_base;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let tx = lid % WX;
    let ty = lid / WX;
    let a_base = P.a_off + batch * P.a_sb;
    let b_base = P.b_off + batch * P.b_sb;
    {{ACC_DECL}}
    {{MAIN_LOOP}}
    let c_base = P.c_off + batch * P.c_sb;
    {{STORE_ALL}}
}
