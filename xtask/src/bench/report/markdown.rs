//! `report.md`: the report's [`Block`]s as GitHub-flavoured Markdown; charts are linked as SVG
//! files written beside it.

use super::blocks::Block;

/// The blocks as Markdown; each chart becomes an image link to `<name>.svg`.
pub fn render(blocks: &[Block]) -> String {
    let mut out = String::new();
    for block in blocks {
        match block {
            Block::Heading(level, text) => {
                out.push_str(&"#".repeat(usize::from(*level)));
                out.push(' ');
                out.push_str(text);
                out.push_str("\n\n");
            }
            Block::Paragraph(text) => {
                out.push_str(text);
                out.push_str("\n\n");
            }
            Block::Bullets(items) => {
                for item in items {
                    out.push_str("- ");
                    out.push_str(item);
                    out.push('\n');
                }
                out.push('\n');
            }
            Block::Table(table) => {
                out.push_str(&row(&table.headers));
                out.push_str(&row(&vec!["---".to_string(); table.headers.len()]));
                for cells in &table.rows {
                    out.push_str(&row(cells));
                }
                out.push('\n');
            }
            Block::Chart { name, title, .. } => {
                out.push_str(&format!("![{title}]({name}.svg)\n\n"));
            }
        }
    }
    out
}

fn row(cells: &[String]) -> String {
    let escaped: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
    format!("| {} |\n", escaped.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::blocks::Table;

    #[test]
    fn tables_and_charts_render_as_markdown() {
        let mut table = Table::new(&["a", "b|c"]);
        table.push(vec!["1".into(), "2".into()]);
        let md = render(&[
            Block::Heading(2, "Title".into()),
            Block::Table(table),
            Block::Chart {
                name: "sweep-time".into(),
                title: "Sweep".into(),
                svg: "<svg/>".into(),
            },
        ]);
        assert_eq!(
            md,
            "## Title\n\n| a | b\\|c |\n| --- | --- |\n| 1 | 2 |\n\n![Sweep](sweep-time.svg)\n\n"
        );
    }
}
