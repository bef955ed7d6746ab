//! `report.html`: the report's [`Block`]s as one self-contained HTML page — inline CSS, inline SVG
//! charts, no external resource.

use super::blocks::Block;

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1180px;margin:2em auto;\
padding:0 1em;color:#222;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.9em}\
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}th{background:#f4f4f4}\
tr:nth-child(even) td{background:#fafafa}code{background:#f2f2f2;padding:0 .25em;border-radius:3px}\
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}figure{margin:1em 0}\
figcaption{font-size:.85em;color:#555}svg{max-width:100%;height:auto}";

/// The blocks as a complete HTML document titled `title`.
pub fn render(title: &str, blocks: &[Block]) -> String {
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(title)
    );
    for block in blocks {
        match block {
            Block::Heading(level, text) => out.push_str(&format!("<h{level}>{}</h{level}>\n", inline(text))),
            Block::Paragraph(text) => out.push_str(&format!("<p>{}</p>\n", inline(text))),
            Block::Bullets(items) => {
                out.push_str("<ul>\n");
                for item in items {
                    out.push_str(&format!("<li>{}</li>\n", inline(item)));
                }
                out.push_str("</ul>\n");
            }
            Block::Table(table) => {
                out.push_str("<table>\n<thead><tr>");
                for h in &table.headers {
                    out.push_str(&format!("<th>{}</th>", inline(h)));
                }
                out.push_str("</tr></thead>\n<tbody>\n");
                for cells in &table.rows {
                    out.push_str("<tr>");
                    for c in cells {
                        out.push_str(&format!("<td>{}</td>", inline(c)));
                    }
                    out.push_str("</tr>\n");
                }
                out.push_str("</tbody>\n</table>\n");
            }
            Block::Chart { title, svg, .. } => {
                let body = svg.find("<svg").map(|i| &svg[i..]).unwrap_or(svg);
                out.push_str(&format!(
                    "<figure>\n{body}\n<figcaption>{}</figcaption>\n</figure>\n",
                    escape(title)
                ));
            }
        }
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// Escape text for HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Escape text and turn `code` spans into `<code>`.
fn inline(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in escape(text).split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str("<code>");
            out.push_str(part);
            out.push_str("</code>");
        } else {
            out.push_str(part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_self_contained_with_inline_svg() {
        let html = render(
            "r",
            &[
                Block::Paragraph("a `<b>` c".into()),
                Block::Chart {
                    name: "x".into(),
                    title: "X".into(),
                    svg: "<?xml version=\"1.0\"?>\n<svg width=\"1\"></svg>".into(),
                },
            ],
        );
        assert!(html.contains("<p>a <code>&lt;b&gt;</code> c</p>"), "{html}");
        assert!(html.contains("<figure>\n<svg width=\"1\"></svg>"), "{html}");
        assert!(!html.contains("<?xml"), "an XML declaration inside HTML is invalid");
        assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    }
}
