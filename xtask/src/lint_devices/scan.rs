//! The device lint's rules over one file's tokens (LESSONS R17): device strings, device
//! constructions and `.cuda()`-style moves, except on lines and in items a user marked with
//! `// cartage: device-entry` (the one place that picks the device).

use super::tokens::{Token, TokenKind, tokenize};

/// The comment text that marks the entry point (on its own line above or inside an item, or at the
/// end of a line of code).
pub const ENTRY_MARKER: &str = "cartage: device-entry";

/// What kind of hard-coded device a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A string such as `"cuda:0"`, `"wgpu:1"` or `"cpu"`.
    DeviceString,
    /// A bare `"cuda"` / `"wgpu"`: hard-coded and, in cartage, not even a device.
    BareDeviceString,
    /// `Device::cuda(..)`, `Device::wgpu(..)`, `Device::cpu()`, `Device::new(DeviceKind::..)`,
    /// or an enum-style `Device::Cuda`.
    Construction,
    /// A PyTorch-style `.cuda()` / `.cpu()` / `.wgpu()` move.
    MethodMove,
}

impl Rule {
    /// What to do instead.
    pub fn hint(self) -> &'static str {
        match self {
            Rule::DeviceString => {
                "a device string fixes where data lives; take a `&Device` parameter and pass down the one \
                 `Device::pick()` made at the entry point (CARTAGE_DEVICE overrides it)"
            }
            Rule::BareDeviceString => {
                "a bare `cuda`/`wgpu` names no card (cartage refuses it: write an ordinal); better, take a \
                 `&Device` parameter picked once at the entry point"
            }
            Rule::Construction => {
                "constructing a fixed device here bypasses the one the program picked; take a `&Device` \
                 parameter instead, or mark the entry point with `// cartage: device-entry`"
            }
            Rule::MethodMove => {
                "`.cuda()`-style moves hard-code the destination; move with `.to(&device)` using the device \
                 picked once at the entry point"
            }
        }
    }
}

/// One hard-coded device found in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// 1-based line.
    pub line: usize,
    /// Which rule.
    pub rule: Rule,
}

const KINDS: [&str; 3] = ["cpu", "cuda", "wgpu"];

/// Classify a string literal's contents as a device string.
fn device_string(contents: &str) -> Option<Rule> {
    let text = contents.trim().to_ascii_lowercase();
    let (kind, ordinal) = match text.split_once(':') {
        Some((kind, ordinal)) => (kind, Some(ordinal)),
        None => (text.as_str(), None),
    };
    if !KINDS.contains(&kind) {
        return None;
    }
    match ordinal {
        None if kind == "cpu" => Some(Rule::DeviceString),
        None => Some(Rule::BareDeviceString),
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => Some(Rule::DeviceString),
        Some(_) => None,
    }
}

fn is_ident(token: Option<&Token>, names: &[&str]) -> bool {
    matches!(token.map(|t| &t.kind), Some(TokenKind::Ident(name)) if names.contains(&name.as_str()))
}

fn is_punct(token: Option<&Token>, c: char) -> bool {
    matches!(token.map(|t| &t.kind), Some(TokenKind::Punct(p)) if *p == c)
}

/// True when `code[i]` is `Device` followed by `::`, i.e. a path into the device type.
fn device_path_at(code: &[&Token], i: usize) -> bool {
    is_ident(code.get(i).copied(), &["Device"])
        && is_punct(code.get(i + 1).copied(), ':')
        && is_punct(code.get(i + 2).copied(), ':')
}

fn rule_at(code: &[&Token], i: usize) -> Option<Rule> {
    let at = |k: usize| code.get(k).copied();
    match &code[i].kind {
        TokenKind::Str(s) => device_string(s),
        TokenKind::Ident(_) if device_path_at(code, i) => {
            let constructor = is_ident(at(i + 3), &KINDS);
            let variant = is_ident(at(i + 3), &["Cpu", "Cuda", "Wgpu"]);
            let from_kind =
                is_ident(at(i + 3), &["new"]) && is_punct(at(i + 4), '(') && is_ident(at(i + 5), &["DeviceKind"]);
            (constructor || variant || from_kind).then_some(Rule::Construction)
        }
        TokenKind::Punct('.') => {
            let moved = is_ident(at(i + 1), &KINDS) && is_punct(at(i + 2), '(');
            (moved && !is_punct(at(i.wrapping_sub(1)), '.')).then_some(Rule::MethodMove)
        }
        _ => None,
    }
}

/// Inclusive line ranges exempt from the lint in this file.
fn exempt_ranges(tokens: &[Token]) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let TokenKind::Comment(text) = &token.kind else {
            continue;
        };
        if !text.contains(ENTRY_MARKER) {
            continue;
        }
        let code_on_line = tokens
            .iter()
            .any(|t| !matches!(t.kind, TokenKind::Comment(_)) && t.line <= token.line && token.line <= t.end_line);
        if code_on_line {
            ranges.push((token.line, token.line));
        } else if let Some(range) = item_after(tokens, i).or_else(|| enclosing_block(tokens, i)) {
            ranges.push(range);
        } else {
            ranges.push((token.line, token.line));
        }
    }
    ranges
}

/// The lines of the item (fn, mod, impl…) that starts right after the marker at `marker`: only
/// attributes, doc comments and modifiers may stand between.
fn item_after(tokens: &[Token], marker: usize) -> Option<(usize, usize)> {
    const MODIFIERS: [&str; 9] = [
        "pub", "crate", "async", "const", "unsafe", "extern", "fn", "mod", "impl",
    ];
    let mut i = marker + 1;
    while i < tokens.len() {
        match &tokens[i].kind {
            TokenKind::Comment(_) => i += 1,
            TokenKind::Punct('#') => i = skip_group(tokens, i + 1, '[', ']')?,
            TokenKind::Punct('(') => i = skip_group(tokens, i, '(', ')')?,
            TokenKind::Str(_) => i += 1,
            TokenKind::Ident(name) if MODIFIERS.contains(&name.as_str()) => {
                if matches!(name.as_str(), "fn" | "mod" | "impl") {
                    return block_lines(tokens, i);
                }
                i += 1;
            }
            _ => return None,
        }
    }
    None
}

/// From the `open` token at `start`, the index just past its matching `close`.
fn skip_group(tokens: &[Token], start: usize, open: char, close: char) -> Option<usize> {
    if !is_punct(tokens.get(start), open) {
        return None;
    }
    let mut depth = 0usize;
    for (k, t) in tokens.iter().enumerate().skip(start) {
        match t.kind {
            TokenKind::Punct(c) if c == open => depth += 1,
            TokenKind::Punct(c) if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Some(k + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The lines from the item keyword at `start` to the `}` closing its body.
fn block_lines(tokens: &[Token], start: usize) -> Option<(usize, usize)> {
    let open = (start..tokens.len()).find(|&k| is_punct(tokens.get(k), '{') || is_punct(tokens.get(k), ';'))?;
    if is_punct(tokens.get(open), ';') {
        return Some((tokens[start].line, tokens[open].line));
    }
    let end = skip_group(tokens, open, '{', '}')?;
    Some((tokens[start].line, tokens[end - 1].line))
}

/// The innermost `fn`/`mod`/`impl` body containing the marker at `marker`.
fn enclosing_block(tokens: &[Token], marker: usize) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for (k, t) in tokens.iter().enumerate().take(marker) {
        if !is_ident(Some(t), &["fn", "mod", "impl"]) {
            continue;
        }
        if let Some((first, last)) = block_lines(tokens, k)
            && first <= tokens[marker].line
            && tokens[marker].line <= last
            && best.is_none_or(|(b0, b1)| last - first < b1 - b0)
        {
            best = Some((first, last));
        }
    }
    best
}

/// Every hard-coded device in `source` outside the marked entry points, in line order.
pub fn scan_source(source: &str) -> Vec<Finding> {
    let tokens = tokenize(source);
    let exempt = exempt_ranges(&tokens);
    let code: Vec<&Token> = tokens
        .iter()
        .filter(|t| !matches!(t.kind, TokenKind::Comment(_)))
        .collect();
    let mut findings: Vec<Finding> = (0..code.len())
        .filter_map(|i| {
            rule_at(&code, i).map(|rule| Finding {
                line: code[i].line,
                rule,
            })
        })
        .filter(|f| !exempt.iter().any(|&(a, b)| a <= f.line && f.line <= b))
        .collect();
    findings.dedup();
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(src: &str) -> Vec<(usize, Rule)> {
        scan_source(src).into_iter().map(|f| (f.line, f.rule)).collect()
    }

    #[test]
    fn device_strings() {
        assert_eq!(device_string("cuda:0"), Some(Rule::DeviceString));
        assert_eq!(device_string(" WGPU:12 "), Some(Rule::DeviceString));
        assert_eq!(device_string("cpu"), Some(Rule::DeviceString));
        assert_eq!(device_string("cuda"), Some(Rule::BareDeviceString));
        for not_device in ["cuda:x", "cuda:", "cudnn", "running on cpu", "{device}", ""] {
            assert_eq!(device_string(not_device), None, "{not_device}");
        }
    }

    #[test]
    fn constructions_and_moves() {
        let src = "let a = Device::cuda(1);\nlet b = cartage::Device::cpu();\nlet c = x.cuda();\nlet f = o.unwrap_or_else(Device::cpu);\nlet d = Device::Cuda(0);\nlet e = Device::new(DeviceKind::Wgpu, 0);\nlet ok = Device::pick()?;\nlet ok2 = t.to(&device)?;";
        assert_eq!(
            rules(src),
            vec![
                (1, Rule::Construction),
                (2, Rule::Construction),
                (3, Rule::MethodMove),
                (4, Rule::Construction),
                (5, Rule::Construction),
                (6, Rule::Construction)
            ]
        );
    }

    #[test]
    fn markers_exempt_a_line_or_an_item() {
        let src = "\
fn other() { let d = \"cuda:0\"; }
// cartage: device-entry
#[allow(unused)]
pub fn main() {
    let d = Device::pick().unwrap_or(Device::cpu());
}
fn helper() {
    let a = Device::cuda(0); // cartage: device-entry
    let b = Device::cuda(1);
}
fn inner() {
    // cartage: device-entry
    let c = Device::wgpu(0);
}
fn after() { x.cuda() }
";
        assert_eq!(
            rules(src),
            vec![(1, Rule::DeviceString), (9, Rule::Construction), (15, Rule::MethodMove)]
        );
    }
}
