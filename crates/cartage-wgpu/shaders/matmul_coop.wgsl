// Matmul of f16 operands on cooperative matrices (tensor cores), accumulated in f32:
// C[b] = A[b] × B[b] with A [M, K] and B [K, N] row-major (unit inner stride) and C an f32
// row-major scratch. One workgroup is one subgroup of {{SUBGROUP}} invocations computing a
// {{BM}} × {{BN}} block of C as {{FM}} × {{FN}} fragments of 16 × 16, stepping K sixteen at a time
// with fragments loaded straight from storage (with `loop_prefetch`, opt-in, the next step's
// fragments load while this step multiplies). The host takes this path only when M, N and K are multiples of
// the block and of 16 and every offset and stride keeps fragments aligned.

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
@group(0) @binding(1) var<storage, read_write> a: array<f16>;
@group(0) @binding(2) var<storage, read_write> b: array<f16>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

@compute @workgroup_size({{SUBGROUP}})
fn main(@builtin(workgroup_id) wid: vec3<u32>) {
    let batch = wid.z + P.batch_base;
    let row0 = wid.y * {{BM}}u;
    let col0 = wid.x * {{BN}}u;
    let a_base = P.a_off + batch * P.a_sb + row0 * P.a_sm;
    let b_base = P.b_off + batch * P.b_sb + col0;
    {{ACC_DECL}}
    {{MAIN_LOOP}}
    let c_base = P.c_off + batch * P.c_sb + row0 * P.c_sm + col0;
    {{STORES}}
}

//# loop_plain
for (var k0 = 0u; k0 < P.k; k0 = k0 + 16u) {
        {{LOADS}}
        {{MMA}}
    }
//# loop_prefetch
var k0 = 0u;
    {{LOADS_VAR}}
    for (var step = 0u; step < P.k; step = step + 16u) {
        // The last step loads its own fragments again (never past K).
        k0 = min(step + 16u, P.k - 16u);
        {{LOADS_NEXT}}
        {{MMA}}
        {{ROTATE}}
    }
//# load_a_var
var a{{I}} = coopLoadT<coop_mat16x16<f16, A>>(&a[a_base + {{I}}u * 16u * P.a_sm + k0], P.a_sm);
//# load_b_var
var b{{J}} = coopLoadT<coop_mat16x16<f16, B>>(&b[b_base + k0 * P.b_sk + {{J}}u * 16u], P.b_sk);
//# load_a_next
let na{{I}} = coopLoadT<coop_mat16x16<f16, A>>(&a[a_base + {{I}}u * 16u * P.a_sm + k0], P.a_sm);
//# load_b_next
let nb{{J}} = coopLoadT<coop_mat16x16<f16, B>>(&b[b_base + k0 * P.b_sk + {{J}}u * 16u], P.b_sk);
//# rotate_a
a{{I}} = na{{I}};
//# rotate_b
b{{J}} = nb{{J}};
//# acc_decl
var acc_{{I}}_{{J}} = coop_mat16x16<f32, C>();
//# load_a
let a{{I}} = coopLoadT<coop_mat16x16<f16, A>>(&a[a_base + {{I}}u * 16u * P.a_sm + k0], P.a_sm);
//# load_b
let b{{J}} = coopLoadT<coop_mat16x16<f16, B>>(&b[b_base + k0 * P.b_sk + {{J}}u * 16u], P.b_sk);
//# mma
acc_{{I}}_{{J}} = coopMultiplyAdd(a{{I}}, b{{J}}, acc_{{I}}_{{J}});
//# store
{
        // Every operand in a `let` first: the store's arguments must be evaluated before it.
        let value = acc_{{I}}_{{J}};
        let stride = P.c_sm;
        let at = c_base + {{I}}u * 16u * stride + {{J}}u * 16u;
        coopStoreT(value, &c[at], stride);
    }
