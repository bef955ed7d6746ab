//! A small Rust tokenizer for the device lint: just enough to tell code from comments and string
//! literals (raw, byte and C strings included), so that `"cuda:0"` inside a comment or a doc
//! example is not reported and `// cartage: device-entry` markers are found.

/// What a token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// An identifier or keyword (raw identifiers without their `r#`).
    Ident(String),
    /// The contents of a string literal, escapes left as written.
    Str(String),
    /// A comment's text, without its `//` or `/* */`.
    Comment(String),
    /// One punctuation character (`::` is two `:` tokens).
    Punct(char),
    /// A number, char literal or lifetime: code, but nothing the lint looks at.
    Other,
}

/// A token and the 1-based lines it starts and ends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// What it is.
    pub kind: TokenKind,
    /// The line of its first character.
    pub line: usize,
    /// The line of its last character (differs from `line` for multi-line strings and comments).
    pub end_line: usize,
}

struct Cursor {
    chars: Vec<char>,
    pos: usize,
    line: usize,
}

impl Cursor {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.get(self.pos).copied()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek(0).filter(|&c| keep(c)) {
            out.push(c);
            self.bump();
        }
        out
    }
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Split `source` into tokens. Never fails: unterminated literals and comments run to the end.
pub fn tokenize(source: &str) -> Vec<Token> {
    let mut cur = Cursor {
        chars: source.chars().collect(),
        pos: 0,
        line: 1,
    };
    let mut tokens = Vec::new();
    while let Some(c) = cur.peek(0) {
        let line = cur.line;
        let kind = if c.is_whitespace() {
            cur.bump();
            continue;
        } else if c == '/' && cur.peek(1) == Some('/') {
            cur.bump();
            cur.bump();
            TokenKind::Comment(cur.take_while(|c| c != '\n'))
        } else if c == '/' && cur.peek(1) == Some('*') {
            TokenKind::Comment(block_comment(&mut cur))
        } else if let Some(prefix_len) = string_prefix(&cur) {
            for _ in 0..prefix_len {
                cur.bump();
            }
            TokenKind::Str(string_literal(&mut cur))
        } else if c == 'r' && cur.peek(1) == Some('#') && cur.peek(2).is_some_and(is_ident_start) {
            cur.bump();
            cur.bump();
            TokenKind::Ident(cur.take_while(is_ident_continue))
        } else if is_ident_start(c) {
            TokenKind::Ident(cur.take_while(is_ident_continue))
        } else if c.is_ascii_digit() {
            cur.take_while(is_ident_continue);
            TokenKind::Other
        } else if c == '\'' {
            char_or_lifetime(&mut cur);
            TokenKind::Other
        } else {
            cur.bump();
            TokenKind::Punct(c)
        };
        tokens.push(Token {
            kind,
            line,
            end_line: cur.line,
        });
    }
    tokens
}

/// The length of a string literal's prefix up to and including the opening `"` or the `r`/`#`s
/// of a raw string (`"`, `b"`, `c"`, `r"`, `r#"`, `br##"` …), or `None` when no string starts here.
fn string_prefix(cur: &Cursor) -> Option<usize> {
    let mut i = 0;
    if matches!(cur.peek(0), Some('b' | 'c')) {
        i += 1;
    }
    if cur.peek(i) == Some('r') {
        let mut j = i + 1;
        while cur.peek(j) == Some('#') {
            j += 1;
        }
        return (cur.peek(j) == Some('"')).then_some(i);
    }
    (cur.peek(i) == Some('"')).then_some(i)
}

/// Read a string literal starting at `"` or at the `r` of a raw string; returns its contents.
fn string_literal(cur: &mut Cursor) -> String {
    let mut out = String::new();
    if cur.peek(0) == Some('r') {
        cur.bump();
        let hashes = cur.take_while(|c| c == '#').len();
        cur.bump(); // the opening quote
        while let Some(c) = cur.bump() {
            if c == '"' && (0..hashes).all(|k| cur.peek(k) == Some('#')) {
                for _ in 0..hashes {
                    cur.bump();
                }
                return out;
            }
            out.push(c);
        }
        return out;
    }
    cur.bump(); // the opening quote
    while let Some(c) = cur.bump() {
        match c {
            '"' => return out,
            '\\' => {
                out.push(c);
                if let Some(escaped) = cur.bump() {
                    out.push(escaped);
                }
            }
            _ => out.push(c),
        }
    }
    out
}

fn block_comment(cur: &mut Cursor) -> String {
    cur.bump();
    cur.bump();
    let mut depth = 1;
    let mut out = String::new();
    while let Some(c) = cur.bump() {
        if c == '/' && cur.peek(0) == Some('*') {
            cur.bump();
            depth += 1;
            out.push_str("/*");
        } else if c == '*' && cur.peek(0) == Some('/') {
            cur.bump();
            depth -= 1;
            if depth == 0 {
                break;
            }
            out.push_str("*/");
        } else {
            out.push(c);
        }
    }
    out
}

/// `'a'`, `'\n'`, `'\u{1F600}'` are char literals; `'a` and `'static` are lifetimes.
fn char_or_lifetime(cur: &mut Cursor) {
    cur.bump(); // the opening quote
    if cur.peek(0) == Some('\\') {
        cur.bump();
        cur.bump();
        cur.take_while(|c| c != '\'' && c != '\n');
        if cur.peek(0) == Some('\'') {
            cur.bump();
        }
    } else if cur.peek(1) == Some('\'') {
        cur.bump();
        cur.bump();
    } else {
        cur.take_while(is_ident_continue);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<TokenKind> {
        tokenize(src).into_iter().map(|t| t.kind).collect()
    }

    #[test]
    fn strings_of_every_form() {
        let strings: Vec<String> = tokenize(r####"a("x\"y"); b"cuda"; r#"q"uote"#; br##"z"##; c"c""####)
            .into_iter()
            .filter_map(|t| match t.kind {
                TokenKind::Str(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(strings, vec![r#"x\"y"#, "cuda", r#"q"uote"#, "z", "c"]);
    }

    #[test]
    fn comments_hide_their_contents() {
        let toks = kinds("/* a /* nested \"cuda:0\" */ still */ x // \"cpu\"\ny");
        assert_eq!(
            toks,
            vec![
                TokenKind::Comment(" a /* nested \"cuda:0\" */ still ".into()),
                TokenKind::Ident("x".into()),
                TokenKind::Comment(" \"cpu\"".into()),
                TokenKind::Ident("y".into()),
            ]
        );
    }

    #[test]
    fn lifetimes_and_chars_do_not_open_strings() {
        let toks = kinds("fn f<'a>(x: &'a str) { let q = '\"'; let e = '\\''; g(\"cuda\") }");
        assert!(toks.contains(&TokenKind::Str("cuda".into())), "{toks:?}");
        assert_eq!(toks.iter().filter(|t| matches!(t, TokenKind::Str(_))).count(), 1);
    }

    #[test]
    fn lines_are_counted_through_multiline_tokens() {
        let toks = tokenize("/*\n\n*/ \"a\nb\" x");
        assert_eq!((toks[0].line, toks[0].end_line), (1, 3));
        assert_eq!((toks[1].line, toks[1].end_line), (3, 4));
        assert_eq!(toks[2].line, 4);
    }

    #[test]
    fn raw_identifiers() {
        assert_eq!(kinds("r#cuda"), vec![TokenKind::Ident("cuda".into())]);
    }
}
