//! `report.md`: the report's [`Block`]s as GitHub-flavoured Markdown; charts are linked as SVG
//! files written beside it, collapsed blocks use `<details>`, and a cell's note follows its text
//! in parentheses.

use super::blocks::{Block, Cell};

/// The blocks as Markdown; each chart becomes an image link to `<name>.svg`.
pub fn render(blocks: &[Block]) -> String {
    let mut out = String::new();
    for block in blocks {
        render_block(&mut out, block);
    }
    out
}

fn render_block(out: &mut String, block: &Block) {
    match block {
        Block::Heading { level, text, anchor } => {
            if let Some(anchor) = anchor {
                out.push_str(&format!("<a id=\"{anchor}\"></a>\n\n"));
            }
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
        Block::Facts(facts) => {
            for (name, value) in facts {
                out.push_str(&format!("- **{name}:** {value}\n"));
            }
            out.push('\n');
        }
        Block::Contents(entries) => {
            out.push_str("**Contents**\n\n");
            for (anchor, text) in entries {
                out.push_str(&format!("- [{text}](#{anchor})\n"));
            }
            out.push('\n');
        }
        Block::Table(table) => {
            out.push_str(&row(&table.headers));
            out.push_str(&row(&vec!["---".to_string(); table.headers.len()]));
            for cells in &table.rows {
                out.push_str(&row(&cells.iter().map(cell).collect::<Vec<_>>()));
            }
            out.push('\n');
        }
        Block::Chart { name, title, .. } => {
            out.push_str(&format!("![{title}]({name}.svg)\n\n"));
        }
        Block::Details { summary, blocks } => {
            out.push_str(&format!("<details>\n<summary>{summary}</summary>\n\n"));
            for block in blocks {
                render_block(out, block);
            }
            out.push_str("</details>\n\n");
        }
    }
}

/// A cell's text, with its note in parentheses.
fn cell(c: &Cell) -> String {
    match &c.note {
        Some(note) => format!("{} ({note})", c.text),
        None => c.text.clone(),
    }
}

fn row(cells: &[String]) -> String {
    let escaped: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
    format!("| {} |\n", escaped.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::blocks::{Table, Tone};

    #[test]
    fn tables_and_charts_render_as_markdown() {
        let mut table = Table::new(&["a", "b|c"]);
        table.push(vec!["1".into(), Cell::toned("2.0× faster", Tone::Good).with_note("p")]);
        let md = render(&[
            Block::anchored(2, "Title", "title"),
            Block::Table(table),
            Block::Chart {
                name: "sweep-time-f32".into(),
                title: "Sweep".into(),
                svg: "<svg/>".into(),
            },
            Block::Facts(vec![("Date".into(), "today".into())]),
        ]);
        assert_eq!(
            md,
            "<a id=\"title\"></a>\n\n## Title\n\n| a | b\\|c |\n| --- | --- |\n| 1 | 2.0× faster (p) |\n\n\
             ![Sweep](sweep-time-f32.svg)\n\n- **Date:** today\n\n"
        );
    }
}
