// Patch up to four 32-bit words of a buffer: word = (word & ~mask) | bits. Host writes use it
// for the bytes of a range that do not fill whole words.

struct Params {
    count: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    // (word index, mask, bits, unused) per word
    words: array<vec4<u32>, 4>,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> words: array<u32>;

@compute @workgroup_size(4)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    if lid.x >= P.count {
        return;
    }
    let w = P.words[lid.x];
    words[w.x] = (words[w.x] & ~w.y) | (w.z & w.y);
}
