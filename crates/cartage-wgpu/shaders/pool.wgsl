// 2-D max and average pooling and their input gradients over [N, C, H, W] planes. The head is
// the kernel; its body is one of the pieces below. The forward runs one invocation per element
// of the contiguous output [N, C, OH, OW] and walks its window's taps in row-major order; the
// backward runs one invocation per element of the contiguous input gradient [N, C, H, W] and
// gathers over the windows that contain it (each invocation owns its element: no atomic adds;
// sums in f32, f64 for f64, rounded once on store). Bindings: b1 the input (forward) or the
// incoming gradient (backward), read through `P.s1` (its strides over N, C, H, W); b2 the
// contiguous result; b3 the i64 indices as word pairs (low, high), contiguous in the forward,
// through `P.s3` in the backward. `P.offs` holds the element offsets of b1, b2, b3.

{{PRELUDE}}

struct Params {
    count: u32,
    channels: u32,
    oh: u32,
    ow: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    // 1: an average divides by the whole window (count_include_pad).
    whole: u32,
    unused: u32,
    offs: vec4<u32>,
    s1: vec4<u32>,
    s3: vec4<u32>,
}

@group(0) @binding(0) var<uniform> P: Params;

{{BINDINGS}}
{{ACCESSORS}}

// The input row (`a`, along H) or column (along W) of tap `tap` of window `i`, padded
// coordinates first: `inside` is false where the tap falls in the padding.
struct Tap {
    at: u32,
    inside: bool,
}

fn tap_row(i: u32, a: u32) -> Tap {
    let u = i * P.sh + a * P.dh;
    return Tap(u - P.ph, u >= P.ph && u - P.ph < P.h);
}

fn tap_col(j: u32, b: u32) -> Tap {
    let u = j * P.sw + b * P.dw;
    return Tap(u - P.pw, u >= P.pw && u - P.pw < P.w);
}

{{BODY}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 256u;
    if e >= P.count {
        return;
    }
    element(e);
}

//# forward_max
// The first NaN tap, else the first largest tap (strictly larger replaces), and its flat index
// y·W + x in the input plane.
fn element(o: u32) {
    let j = o % P.ow;
    let i = (o / P.ow) % P.oh;
    let nc = o / P.ow / P.oh;
    let base = P.offs.x + (nc / P.channels) * P.s1.x + (nc % P.channels) * P.s1.y;
    var best = {{ZERO}};
    var at = 0u;
    var found = false;
    for (var a = 0u; a < P.kh; a = a + 1u) {
        let y = tap_row(i, a);
        if !y.inside {
            continue;
        }
        for (var b = 0u; b < P.kw; b = b + 1u) {
            let x = tap_col(j, b);
            if !x.inside {
                continue;
            }
            let v = ld_x(base + y.at * P.s1.z + x.at * P.s1.w);
            if {{IS_NAN}}(v) {
                store_out(P.offs.y + o, v);
                store_index(o, y.at * P.w + x.at);
                return;
            }
            if !found || v > best {
                best = v;
                at = y.at * P.w + x.at;
                found = true;
            }
        }
    }
    store_out(P.offs.y + o, best);
    store_index(o, at);
}

//# forward_avg
// The sum of the taps inside the input over the whole window's size or over their number.
fn element(o: u32) {
    let j = o % P.ow;
    let i = (o / P.ow) % P.oh;
    let nc = o / P.ow / P.oh;
    let base = P.offs.x + (nc / P.channels) * P.s1.x + (nc % P.channels) * P.s1.y;
    var sum = {{ZERO}};
    var taps = 0u;
    for (var a = 0u; a < P.kh; a = a + 1u) {
        let y = tap_row(i, a);
        if !y.inside {
            continue;
        }
        for (var b = 0u; b < P.kw; b = b + 1u) {
            let x = tap_col(j, b);
            if !x.inside {
                continue;
            }
            sum = sum + ld_x(base + y.at * P.s1.z + x.at * P.s1.w);
            taps = taps + 1u;
        }
    }
    let divisor = select(taps, P.kh * P.kw, P.whole != 0u);
    store_out(P.offs.y + o, sum / {{T}}(divisor));
}

//# backward
// Window row i contains input row y through tap a when t = y + pad − a·dil ≥ 0 is a multiple
// of the stride and i = t / stride < OH (likewise for columns); each such window adds
// `term(i, j)`.
fn element(p: u32) {
    let x = p % P.w;
    let y = (p / P.w) % P.h;
    let nc = p / P.w / P.h;
    let n = nc / P.channels;
    let c = nc % P.channels;
    let here = y * P.w + x;
    var acc = {{ZERO}};
    for (var a = 0u; a < P.kh; a = a + 1u) {
        let reach = a * P.dh;
        if reach > y + P.ph {
            break;
        }
        let t = y + P.ph - reach;
        if t % P.sh != 0u || t / P.sh >= P.oh {
            continue;
        }
        let i = t / P.sh;
        for (var b = 0u; b < P.kw; b = b + 1u) {
            let across = b * P.dw;
            if across > x + P.pw {
                break;
            }
            let s = x + P.pw - across;
            if s % P.sw != 0u || s / P.sw >= P.ow {
                continue;
            }
            acc = acc + term(n, c, i, s / P.sw, here);
        }
    }
    store_out(P.offs.y + p, acc);
}

{{TERM}}

//# term_max
// The window's gradient when its recorded index is this element (an index naming any other
// tap, or none, adds nothing).
fn term(n: u32, c: u32, i: u32, j: u32, here: u32) -> {{T}} {
    let index = ld_index(P.offs.z + n * P.s3.x + c * P.s3.y + i * P.s3.z + j * P.s3.w);
    if index.x != here || index.y != 0u {
        return {{ZERO}};
    }
    return ld_g(P.offs.x + n * P.s1.x + c * P.s1.y + i * P.s1.z + j * P.s1.w);
}

//# term_avg
// The window's gradient over its divisor: the whole window, or its taps inside the input
// (averages have dilation 1, so each axis counts the overlap of two ranges).
fn term(n: u32, c: u32, i: u32, j: u32, here: u32) -> {{T}} {
    var divisor = P.kh * P.kw;
    if P.whole == 0u {
        let top = i * P.sh;
        let left = j * P.sw;
        let rows = min(top + P.kh, P.ph + P.h) - max(top, P.ph);
        let cols = min(left + P.kw, P.pw + P.w) - max(left, P.pw);
        divisor = rows * cols;
    }
    return ld_g(P.offs.x + n * P.s1.x + c * P.s1.y + i * P.s1.z + j * P.s1.w) / {{T}}(divisor);
}
