//! `report.json`: the whole [`Report`] as pretty JSON, one object per measurement in `rows`.

use super::Report;

/// The report as JSON text.
pub fn render(report: &Report) -> serde_json::Result<String> {
    serde_json::to_string_pretty(report)
}
