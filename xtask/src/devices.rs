//! `cargo xtask devices`: every device the compiled-in backends found — name, memory, details —
//! with its capabilities as a table of op × dtype (✓ runs, – does not), and for each backend
//! family whether it was compiled in and, when it found no device, why.

use cartage::runtime::{BackendStatus, backend_statuses, is_software_adapter};
use cartage::{Backend, Capabilities, DType, DeviceInfo, Op, backend, format_bytes};

/// Print the report to stdout.
pub fn run() -> anyhow::Result<()> {
    let statuses = backend_statuses();
    println!("Backends");
    for status in &statuses {
        println!("  {}", backend_line(status));
    }
    for info in statuses.iter().flat_map(|s| &s.devices) {
        println!();
        print_device(info, backend(&info.device)?.as_ref());
    }
    if statuses.iter().all(|s| s.devices.is_empty()) {
        anyhow::bail!("no device found by any compiled-in backend");
    }
    Ok(())
}

fn backend_line(status: &BackendStatus) -> String {
    let name = status.kind.name();
    if !status.compiled {
        return format!("{name:<5} not compiled in (feature `{}`)", status.feature);
    }
    let found = match status.devices.len() {
        0 => "compiled in, no device".to_string(),
        1 => "compiled in, 1 device".to_string(),
        n => format!("compiled in, {n} devices"),
    };
    match &status.problem {
        Some(problem) => format!("{name:<5} {found}: {problem}"),
        None => format!("{name:<5} {found}"),
    }
}

fn print_device(info: &DeviceInfo, backend: &dyn Backend) {
    let software = if is_software_adapter(info) {
        " (software adapter)"
    } else {
        ""
    };
    println!("{} — {}{software}", info.device, info.name);
    match info.total_memory {
        Some(bytes) => println!("  memory: {}", format_bytes(bytes)),
        None => println!("  memory: unknown"),
    }
    for (key, value) in &info.details {
        println!("  {key}: {value}");
    }
    let caps = backend.capabilities();
    println!(
        "  max buffer: {}, native f16: {}, device timing: {}, async copies: {}, matmul precision: {}",
        format_bytes(caps.max_buffer_bytes),
        yes_no(caps.native_f16),
        yes_no(caps.device_timing),
        yes_no(caps.async_copies),
        backend.matmul_precision().name()
    );
    print!("{}", capability_table(caps));
}

fn yes_no(flag: bool) -> &'static str {
    if flag { "yes" } else { "no" }
}

/// The op × dtype table; a cast row reads "from the column's dtype to the row's".
fn capability_table(caps: &Capabilities) -> String {
    let ops = Op::all();
    let width = ops.iter().map(|op| op.name().len()).max().unwrap_or(8) + 2;
    let mut out = format!("  {:<width$}", "op \\ dtype");
    for dtype in DType::ALL {
        out.push_str(&format!("{:>6}", dtype.name()));
    }
    out.push('\n');
    for op in ops {
        out.push_str(&format!("  {:<width$}", op.name()));
        for dtype in DType::ALL {
            let mark = if caps.supports(op, dtype) { "✓" } else { "–" };
            out.push_str(&format!("{mark:>6}"));
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "  {} of {} (op, dtype) pairs run here\n",
        caps.len(),
        Op::all().len() * DType::ALL.len()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_marks_supported_pairs() {
        let caps = Capabilities::all_defined(|op, dtype| op == Op::Matmul && dtype == DType::F16);
        let table = capability_table(&caps);
        let matmul = table
            .lines()
            .find(|l| l.trim_start().starts_with("matmul"))
            .expect("a matmul row");
        let marks: Vec<&str> = matmul.split_whitespace().skip(1).collect();
        assert_eq!(marks, ["✓", "✓", "–", "✓", "–", "–", "–", "–"]);
        assert!(table.lines().next().is_some_and(|h| h.contains("bf16")));
    }
}
