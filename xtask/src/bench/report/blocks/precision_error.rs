//! The precision section's error table: for each device, the normwise error of its f32, TF32,
//! f16 and bf16 matmul against an f64 product on the host, cartage's beside the reference
//! library's (LESSONS R24, R32).

use super::{Block, Cell, Table, Tone, devices_in, library_name};
use crate::bench::cases::Section;
use crate::bench::precision_error::{COUNTER, SAMPLED_ROWS};
use crate::bench::report::{Report, Row};

/// The table, or a sentence saying the report predates the measurement.
pub(super) fn build(report: &Report) -> Vec<Block> {
    let devices = devices_in(report, Section::Precision);
    let rows: Vec<&Row> = report.section_rows(Section::Precision).collect();
    if rows.is_empty() {
        return Vec::new();
    }
    let intro = format!(
        "Error of the same products: f32 normal operands drawn on the host, converted to the dtype on the \
         device, multiplied, read back, and compared with their product in f64 computed on the host over \
         {SAMPLED_ROWS} evenly spaced rows. The figure is the largest difference divided by the largest \
         exact entry (normwise, so an entry that sums to nearly zero cannot blow it up); f16 and bf16 \
         include rounding the operands. The reference library's error, where it ran, is measured the same \
         way on its own operands."
    );
    if !rows.iter().any(|r| r.counters.contains_key(COUNTER)) {
        return vec![Block::Paragraph(format!(
            "{intro} This report predates that measurement: its rows carry no error."
        ))];
    }
    let mut table = Table::new(&["Device", "n", "f32", "f32 TF32", "f16", "bf16"]);
    for d in &devices {
        let on_device: Vec<&&Row> = rows.iter().filter(|r| &r.device == d).collect();
        let n = on_device.first().map_or(0, |r| r.size);
        let cell = |case: &str, dtype: &str| {
            let Some(row) = on_device.iter().find(|r| r.case == case && r.dtype == dtype) else {
                return Cell::none();
            };
            let ours = row.counters.get(COUNTER).copied();
            let theirs = row
                .reference
                .as_ref()
                .and_then(|r| r.counters.get(COUNTER).map(|e| (library_name(&r.library), *e)));
            let mut cell = match ours {
                Some(e) => Cell::toned(format_error(e), tone(e, theirs.map(|t| t.1))),
                None => Cell::none(),
            };
            if let Some((library, e)) = theirs {
                cell = cell.with_note(format!("{library} {}", format_error(e)));
            }
            cell
        };
        table.push(vec![
            format!("`{d}`").into(),
            n.to_string().into(),
            cell("matmul", "f32"),
            cell("matmul_tf32", "f32"),
            cell("matmul", "f16"),
            cell("matmul", "bf16"),
        ]);
    }
    vec![Block::Paragraph(intro), Block::Table(table)]
}

/// Worse than the reference by more than a factor of 2 reads bad; otherwise plain.
fn tone(ours: f64, theirs: Option<f64>) -> Tone {
    match theirs {
        Some(t) if t > 0.0 && ours > 2.0 * t => Tone::Bad,
        _ => Tone::Plain,
    }
}

/// `3.1 × 10⁻⁴`: two significant digits and a power of ten.
pub fn format_error(e: f64) -> String {
    if !e.is_finite() {
        return "–".into();
    }
    if e == 0.0 {
        return "0 (exact)".into();
    }
    let exponent = e.log10().floor() as i32;
    let mantissa = e / 10f64.powi(exponent);
    // 9.96 rounds to 10: carry into the exponent.
    let (mantissa, exponent) = if format!("{mantissa:.1}") == "10.0" {
        (1.0, exponent + 1)
    } else {
        (mantissa, exponent)
    };
    let superscript: String = exponent
        .to_string()
        .chars()
        .map(|c| match c {
            '-' => '⁻',
            '0' => '⁰',
            '1' => '¹',
            '2' => '²',
            '3' => '³',
            '4' => '⁴',
            '5' => '⁵',
            '6' => '⁶',
            '7' => '⁷',
            '8' => '⁸',
            _ => '⁹',
        })
        .collect();
    format!("{mantissa:.1} × 10{superscript}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_powers_of_ten() {
        assert_eq!(format_error(3.14e-4), "3.1 × 10⁻⁴");
        assert_eq!(format_error(9.96e-3), "1.0 × 10⁻²");
        assert_eq!(format_error(0.0), "0 (exact)");
        assert_eq!(format_error(2.0e-12), "2.0 × 10⁻¹²");
    }
}
