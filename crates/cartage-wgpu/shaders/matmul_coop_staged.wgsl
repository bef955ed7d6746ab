// Matmul of f16 operands on cooperative matrices, A and B staged through workgroup memory,
// accumulated in f32: C[b] = A[b] × B[b] with A [M, K] and B [K, N] row-major (unit inner
// stride) and C an f32 row-major scratch. A workgroup of {{SUBGROUPS}} subgroups of {{SUBGROUP}}
// computes a {{BM}} × {{BN}} block of C; each subgroup owns a {{WM}} × {{WN}} block, {{FM}} × {{FN}}
// fragments of 16 × 16. K advances {{BK}} at a time: every invocation copies chunks of eight
// f16 values (16 bytes each) of the next A and B tiles into registers while the
// subgroups multiply the current tiles out of workgroup memory ({{STAGES}} buffers: with two,
// the next tiles go to the other buffer and one barrier per step suffices). Staged rows are
// padded by {{PAD}} elements so that the rows of a fragment fall on different banks. The host
// takes this path only when M, N and K are multiples of the block and every offset and stride
// is a multiple of eight elements. The step loops are unrolled by the generator.

enable f16;
enable wgpu_cooperative_matrix;

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
// Eight f16 values (16 bytes) per element: two columns of four (naga's `bitcast` from `u32`
// to `vec2<f16>` mistypes its result, so the words are not read as `u32`).
@group(0) @binding(1) var<storage, read_write> a8: array<mat2x4<f16>>;
@group(0) @binding(2) var<storage, read_write> b8: array<mat2x4<f16>>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
// Row strides of the staged tiles (A is BM × BK, B is BK × BN) and their sizes.
const AS: u32 = BK + {{PAD}}u;
const BS: u32 = BN + {{PAD}}u;
const A_TILE: u32 = BM * AS;
const B_TILE: u32 = BK * BS;

var<workgroup> As: array<f16, {{STAGES}}u * A_TILE>;
var<workgroup> Bs: array<f16, {{STAGES}}u * B_TILE>;

@compute @workgroup_size({{THREADS}})
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sid: u32,
) {
    let batch = wid.z + P.batch_base;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    // In units of eight elements (every offset and stride is a multiple of eight).
    let a_base = (P.a_off + batch * P.a_sb + row0 * P.a_sm) >> 3u;
    let b_base = (P.b_off + batch * P.b_sb + col0) >> 3u;
    let a_row = P.a_sm >> 3u;
    let b_row = P.b_sk >> 3u;
    // This subgroup's block of C inside the workgroup's.
    let wm0 = (sid / {{SGN}}u) * {{WM}}u;
    let wn0 = (sid % {{SGN}}u) * {{WN}}u;
    {{ACC_DECL}}
    let steps = P.k / BK;
    // The first tiles, into buffer 0.
    var k8 = 0u;
    {{FETCH}}
    {{DEPOSIT_FIRST}}
    workgroupBarrier();
    for (var step = 0u; step < steps; step = step + 1u) {
        // The next step's tiles (the last step fetches its own again, never past K).
        k8 = min(step + 1u, steps - 1u) * (BK >> 3u);
        {{FETCH}}
        {{MAIN_STEP}}
    }
    let c_base = P.c_off + batch * P.c_sb + (row0 + wm0) * P.c_sm + col0 + wn0;
    {{STORES}}
}

//# step_two_stages
let cur = step % 2u;
        let a_at = cur * A_TILE;
        let b_at = cur * B_TILE;
        {{MMA_STEPS}}
        let a_next = (1u - cur) * A_TILE;
        let b_next = (1u - cur) * B_TILE;
        {{DEPOSIT}}
        workgroupBarrier();
//# step_one_stage
let a_at = 0u;
        let b_at = 0u;
        {{MMA_STEPS}}
        workgroupBarrier();
        let a_next = 0u;
        let b_next = 0u;
        {{DEPOSIT}}
        workgroupBarrier();
//# fetch_a
let ra{{S}} = a8[a_base + ({{S}}u * {{THREADS}}u + lid) / {{ACH}}u * a_row + k8 + ({{S}}u * {{THREADS}}u + lid) % {{ACH}}u];
//# fetch_b
let rb{{S}} = b8[b_base + (k8 * 8u + ({{S}}u * {{THREADS}}u + lid) / {{BCH}}u) * b_row + ({{S}}u * {{THREADS}}u + lid) % {{BCH}}u];
//# deposit_a
{
            let v = {{S}}u * {{THREADS}}u + lid;
            let at = {{NEXT_A}} + (v / {{ACH}}u) * AS + (v % {{ACH}}u) * 8u;
            let lo = ra{{S}}[0];
            let hi = ra{{S}}[1];
            As[at] = lo.x; As[at + 1u] = lo.y; As[at + 2u] = lo.z; As[at + 3u] = lo.w;
            As[at + 4u] = hi.x; As[at + 5u] = hi.y; As[at + 6u] = hi.z; As[at + 7u] = hi.w;
        }
//# deposit_b
{
            let v = {{S}}u * {{THREADS}}u + lid;
            let at = {{NEXT_B}} + (v / {{BCH}}u) * BS + (v % {{BCH}}u) * 8u;
            let lo = rb{{S}}[0];
            let hi = rb{{S}}[1];
            Bs[at] = lo.x; Bs[at + 1u] = lo.y; Bs[at + 2u] = lo.z; Bs[at + 3u] = lo.w;
            Bs[at + 4u] = hi.x; Bs[at + 5u] = hi.y; Bs[at + 6u] = hi.z; Bs[at + 7u] = hi.w;
        }
//# acc_decl
var acc_{{I}}_{{J}} = coop_mat16x16<f32, C>();
//# frag_a
let fa{{I}} = coopLoadT<coop_mat16x16<f16, A>>(&As[a_at + (wm0 + {{I}}u * 16u) * AS + {{KK}}u * 16u], AS);
//# frag_b
let fb{{J}} = coopLoadT<coop_mat16x16<f16, B>>(&Bs[b_at + {{KK}}u * 16u * BS + wn0 + {{J}}u * 16u], BS);
//# mma
acc_{{I}}_{{J}} = coopMultiplyAdd(fa{{I}}, fb{{J}}, acc_{{I}}_{{J}});
//# mma_step
{
            {{FRAGS}}
            {{MMAS}}
        }
//# store
{
        // Every operand in a `let` first: the store's arguments must be evaluated before it.
        let value = acc_{{I}}_{{J}};
        let stride = P.c_sm;
        let at = c_base + {{I}}u * 16u * stride + {{J}}u * 16u;
        coopStoreT(value, &c[at], stride);
    }
