// Index checking for gather and index_select: an index that is negative, not below the size of
// the indexed dimension, or an i64 with a non-zero high word is reported in this op's slot of
// the flags buffer (flag, low word, high word), which synchronisation reads back as
// Error::IndexOutOfRange. The element itself reads as zero, never out of bounds.

fn report_bad_index(slot: u32, idx: vec2<u32>) {
    let base = slot * 4u;
    let previous = atomicExchange(&flags[base], 1u);
    if previous == 0u {
        atomicStore(&flags[base + 1u], idx.x);
        atomicStore(&flags[base + 2u], idx.y);
    }
}
