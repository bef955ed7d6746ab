//! `report.html`: the report's [`Block`]s as one self-contained HTML page — inline CSS, inline SVG
//! charts (side by side where two follow each other), no external resource. Cells are coloured
//! by their tone: green where cartage or a device is ahead, red where it is behind.

use super::blocks::{Block, Cell, Tone};
use super::charts::WIDTH;

/// The page's CSS. The contents run in two columns (one on a narrow window) with a gap wider
/// than the second column's list numbers ("12."), which sit outside their items: long titles wrap
/// inside their own column.
const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1360px;margin:2em auto;\
padding:0 1em;color:#222;line-height:1.45}\
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.88em}\
th,td{border:1px solid #ddd;padding:.3em .55em;text-align:left;vertical-align:top}\
thead th{background:#f2f2f2;position:sticky;top:0}\
tr:nth-child(even) td{background:#fafafa}\
td.good,tr:nth-child(even) td.good{background:#dff3dc;color:#14501a}\
td.bad,tr:nth-child(even) td.bad{background:#fbe0dd;color:#7d1612}\
td.even,tr:nth-child(even) td.even{background:#eef0f3}\
td.muted{color:#8a8a8a}\
.note{display:block;font-size:.82em;color:#666;white-space:nowrap}\
td.good .note,td.bad .note{color:inherit;opacity:.8}\
.scroll{overflow-x:auto}\
table.facts th{background:#f6f6f6;white-space:nowrap}\
code{background:#f2f2f2;padding:0 .25em;border-radius:3px}\
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2.2em}\
nav.toc{background:#f7f7f9;border:1px solid #e3e3e8;border-radius:6px;padding:.6em 1.2em;margin:1em 0}\
nav.toc ol{columns:2 22em;column-gap:3.5em;margin:.3em 0}\
nav.toc li{break-inside:avoid;overflow-wrap:anywhere}\
.charts{display:flex;flex-wrap:wrap;gap:1em}\
figure{margin:1em 0;flex:1 1 560px;max-width:760px}figure.wide{flex-basis:100%;max-width:1100px}\
figcaption{font-size:.85em;color:#555}\
svg{width:100%;height:auto}\
details{margin:.6em 0 1.2em}summary{cursor:pointer;color:#1f4f8a}";

/// The blocks as a complete HTML document titled `title`.
pub fn render(title: &str, blocks: &[Block]) -> String {
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(title)
    );
    render_blocks(&mut out, blocks);
    out.push_str("</body>\n</html>\n");
    out
}

fn render_blocks(out: &mut String, blocks: &[Block]) {
    let mut i = 0;
    while i < blocks.len() {
        if let Block::Chart { .. } = blocks[i] {
            // Charts that follow each other share a row.
            out.push_str("<div class=\"charts\">\n");
            while let Some(Block::Chart { title, svg, .. }) = blocks.get(i) {
                out.push_str(&figure(title, svg));
                i += 1;
            }
            out.push_str("</div>\n");
            continue;
        }
        render_block(out, &blocks[i]);
        i += 1;
    }
}

fn render_block(out: &mut String, block: &Block) {
    match block {
        Block::Heading { level, text, anchor } => {
            let id = anchor
                .as_ref()
                .map(|a| format!(" id=\"{}\"", escape(a)))
                .unwrap_or_default();
            out.push_str(&format!("<h{level}{id}>{}</h{level}>\n", inline(text)));
        }
        Block::Paragraph(text) => out.push_str(&format!("<p>{}</p>\n", inline(text))),
        Block::Bullets(items) => {
            out.push_str("<ul>\n");
            for item in items {
                out.push_str(&format!("<li>{}</li>\n", inline(item)));
            }
            out.push_str("</ul>\n");
        }
        Block::Facts(facts) => {
            out.push_str("<table class=\"facts\">\n<tbody>\n");
            for (name, value) in facts {
                out.push_str(&format!(
                    "<tr><th scope=\"row\">{}</th><td>{}</td></tr>\n",
                    inline(name),
                    inline(value)
                ));
            }
            out.push_str("</tbody>\n</table>\n");
        }
        Block::Contents(entries) => {
            out.push_str("<nav class=\"toc\"><strong>Contents</strong>\n<ol>\n");
            for (anchor, text) in entries {
                out.push_str(&format!(
                    "<li><a href=\"#{}\">{}</a></li>\n",
                    escape(anchor),
                    inline(text)
                ));
            }
            out.push_str("</ol>\n</nav>\n");
        }
        Block::Table(table) => {
            out.push_str("<div class=\"scroll\"><table>\n<thead><tr>");
            for h in &table.headers {
                out.push_str(&format!("<th>{}</th>", inline(h)));
            }
            out.push_str("</tr></thead>\n<tbody>\n");
            for cells in &table.rows {
                out.push_str("<tr>");
                for c in cells {
                    out.push_str(&cell(c));
                }
                out.push_str("</tr>\n");
            }
            out.push_str("</tbody>\n</table></div>\n");
        }
        Block::Chart { title, svg, .. } => out.push_str(&figure(title, svg)),
        Block::Details { summary, blocks } => {
            out.push_str(&format!("<details>\n<summary>{}</summary>\n", inline(summary)));
            render_blocks(out, blocks);
            out.push_str("</details>\n");
        }
    }
}

/// A chart with its caption; one wider than a line chart takes a row of its own.
fn figure(title: &str, svg: &str) -> String {
    let body = svg.find("<svg").map(|i| &svg[i..]).unwrap_or(svg);
    let width = body
        .split_once("width=\"")
        .and_then(|(_, rest)| rest.split('"').next())
        .and_then(|w| w.parse::<u32>().ok())
        .unwrap_or(0);
    let class = if width > WIDTH { " class=\"wide\"" } else { "" };
    format!(
        "<figure{class}>\n{body}\n<figcaption>{}</figcaption>\n</figure>\n",
        inline(title)
    )
}

/// A `<td>` with its tone as a class and its note as a second line.
fn cell(c: &Cell) -> String {
    let class = match c.tone {
        Tone::Plain => "",
        Tone::Good => " class=\"good\"",
        Tone::Bad => " class=\"bad\"",
        Tone::Even => " class=\"even\"",
        Tone::Muted => " class=\"muted\"",
    };
    let note = c
        .note
        .as_ref()
        .map(|n| format!("<span class=\"note\">{}</span>", inline(n)))
        .unwrap_or_default();
    format!("<td{class}>{}{note}</td>", inline(&c.text))
}

/// Escape text for HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Escape text, turn `code` spans into `<code>` and `**strong**` spans into `<strong>`.
fn inline(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in escape(text).split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str("<code>");
            out.push_str(part);
            out.push_str("</code>");
        } else {
            for (j, piece) in part.split("**").enumerate() {
                if j % 2 == 1 {
                    out.push_str("<strong>");
                    out.push_str(piece);
                    out.push_str("</strong>");
                } else {
                    out.push_str(piece);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::blocks::Table;

    #[test]
    fn the_page_is_self_contained_with_inline_svg() {
        let html = render(
            "r",
            &[
                Block::Paragraph("a `<b>` c **d**".into()),
                Block::Chart {
                    name: "x".into(),
                    title: "X".into(),
                    svg: "<?xml version=\"1.0\"?>\n<svg width=\"1\"></svg>".into(),
                },
            ],
        );
        assert!(
            html.contains("<p>a <code>&lt;b&gt;</code> c <strong>d</strong></p>"),
            "{html}"
        );
        assert!(html.contains("<figure>\n<svg width=\"1\"></svg>"), "{html}");
        assert!(!html.contains("<?xml"), "an XML declaration inside HTML is invalid");
        assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    }

    #[test]
    fn cells_carry_their_tone_and_note_and_facts_have_no_header_row() {
        let mut table = Table::new(&["a"]);
        table.push(vec![Cell::toned("2.0× faster", Tone::Good).with_note("of 4")]);
        let html = render(
            "r",
            &[
                Block::Facts(vec![("Date".into(), "today".into())]),
                Block::Contents(vec![("sweep".into(), "2. Sweep".into())]),
                Block::anchored(2, "2. Sweep", "sweep"),
                Block::Table(table),
            ],
        );
        assert!(
            html.contains("<td class=\"good\">2.0× faster<span class=\"note\">of 4</span></td>"),
            "{html}"
        );
        assert!(html.contains("<th scope=\"row\">Date</th><td>today</td>"), "{html}");
        assert!(!html.contains("<th></th>"), "no empty header cell");
        assert!(html.contains("<a href=\"#sweep\">") && html.contains("<h2 id=\"sweep\">"));
    }
}
