//! The reader of the sources: the items a file declares (declarations, enum variants, public
//! fields, trait items, public methods, trait impls, free functions and constants), read line by
//! line by following braces, strings and comments as rustfmt lays the code out, and which of
//! them are part of the surface.

use std::collections::HashSet;

/// One item the reader saw, with the name of what it belongs to.
#[derive(Debug)]
pub enum Item {
    Declaration {
        kind: &'static str,
        name: String,
        text: String,
        attributes: Vec<String>,
    },
    /// A variant, public field or trait item of `owner`.
    Member { owner: String, text: String },
    /// A public method of an inherent impl of `owner`.
    Method {
        owner: String,
        text: String,
        attributes: Vec<String>,
    },
    /// `impl Trait for Owner`.
    TraitImpl { owner: String, text: String },
    /// A free function or constant (the `testing` module's, a public module's, or re-exported
    /// by lib.rs).
    Function { text: String },
}

impl Item {
    /// The name the item belongs to and its line, if it is public.
    pub fn describe(
        &self,
        exported: &HashSet<String>,
        in_testing: bool,
        module: Option<&str>,
    ) -> Option<(String, String)> {
        let with = |attributes: &Vec<String>| {
            if attributes.is_empty() {
                String::new()
            } else {
                format!("{} ", attributes.join(" "))
            }
        };
        match self {
            Item::Declaration {
                name,
                text,
                attributes,
                ..
            } if exported.contains(name) => {
                Some((name.clone(), format!("{}{text}", with(attributes))))
            }
            Item::Member { owner, text } if exported.contains(owner) => {
                Some((owner.clone(), format!("{owner}: {text}")))
            }
            Item::Method {
                owner,
                text,
                attributes,
            } if exported.contains(owner) => Some((
                owner.clone(),
                format!("{owner}: {}{text}", with(attributes)),
            )),
            Item::TraitImpl { owner, text } if exported.contains(owner) => {
                Some((owner.clone(), text.clone()))
            }
            // A public module's trait implemented for a foreign type (`impl WatchApi for Api<K>`).
            Item::TraitImpl { owner, text }
                if module.is_some() && exported.contains(&impl_trait_name(text)) =>
            {
                Some((owner.clone(), text.clone()))
            }
            Item::Function { text } if in_testing => {
                Some(("testing".to_string(), format!("testing::{text}")))
            }
            Item::Function { text } if module.is_some() => Some((String::new(), text.clone())),
            Item::Function { text } => {
                let name = declared_name(text);
                exported.contains(&name).then(|| (name, text.clone()))
            }
            _ => None,
        }
    }
}

/// What the reader is inside of, at brace depth 1.
enum Block {
    Struct(String),
    Enum(String),
    Trait(String),
    Impl(String),
    Other,
}

pub fn read_items(text: &str) -> Vec<Item> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut block = Block::Other;
    let mut attributes: Vec<String> = Vec::new();
    let mut pending: Option<String> = None; // a declaration spanning lines
    for raw in text.lines() {
        let code = strip_strings_and_comments(raw);
        let line = code.trim();
        let opens = line.matches('{').count();
        let closes = line.matches('}').count();
        if let Some(mut text) = pending.take() {
            text.push(' ');
            text.push_str(line);
            if complete(&text) {
                finish(&mut items, &block, depth, text, &mut attributes);
            } else {
                pending = Some(text);
            }
        } else if line.starts_with("#[") {
            let attribute = line.to_string();
            if attribute.starts_with("#[must_use") || attribute.starts_with("#[derive") {
                attributes.push(attribute);
            }
        } else if depth == 0 && !line.is_empty() {
            block = open_block(line);
            if starts_declaration(line) || line.starts_with("impl") {
                if complete(line) {
                    finish(&mut items, &block, depth, line.to_string(), &mut attributes);
                } else {
                    pending = Some(line.to_string());
                }
            } else {
                attributes.clear();
            }
        } else if depth == 1 && !line.is_empty() && !line.starts_with("//") {
            let member = match &block {
                Block::Struct(_) => line.starts_with("pub "),
                Block::Enum(_) => line.starts_with(|c: char| c.is_ascii_uppercase()),
                Block::Trait(_) => line.starts_with("fn ") || line.starts_with("type "),
                Block::Impl(_) => line.starts_with("pub fn ") || line.starts_with("pub async fn "),
                Block::Other => false,
            };
            if member {
                if complete(line) {
                    finish(&mut items, &block, depth, line.to_string(), &mut attributes);
                } else {
                    pending = Some(line.to_string());
                }
            } else if !line.starts_with("#[") {
                attributes.clear();
            }
        }
        depth = (depth + opens).saturating_sub(closes);
        if depth == 0 && closes > 0 {
            block = Block::Other;
        }
    }
    items
}

/// Whether a declaration read so far is whole: a function or type up to its body or `;`, a
/// variant or field up to its `,`.
fn complete(text: &str) -> bool {
    let ends_at_body = text.contains("fn ")
        || text.starts_with("impl")
        || [
            "pub struct ",
            "pub enum ",
            "pub trait ",
            "pub type ",
            "pub const ",
            "pub static ",
            "type ",
        ]
        .iter()
        .any(|kind| text.starts_with(kind));
    text.contains('{') || text.ends_with(';') || (!ends_at_body && text.ends_with(','))
}

fn starts_declaration(line: &str) -> bool {
    [
        "pub const ",
        "pub struct ",
        "pub enum ",
        "pub trait ",
        "pub type ",
        "pub const ",
        "pub static ",
        "pub fn ",
        "pub async fn ",
    ]
    .iter()
    .any(|kind| line.starts_with(kind))
}

fn open_block(line: &str) -> Block {
    let name = |rest: &str| {
        rest.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<String>()
    };
    if let Some(rest) = line.strip_prefix("pub struct ") {
        Block::Struct(name(rest))
    } else if let Some(rest) = line.strip_prefix("pub enum ") {
        Block::Enum(name(rest))
    } else if let Some(rest) = line.strip_prefix("pub trait ") {
        Block::Trait(name(rest))
    } else if line.starts_with("impl") {
        Block::Impl(impl_self_type(line))
    } else {
        Block::Other
    }
}

/// The type an `impl` line is for: `impl<K> Foo<K> {` → Foo, `impl Clone for Foo {` → Foo.
fn impl_self_type(line: &str) -> String {
    let rest = past_generics(line.strip_prefix("impl").unwrap());
    let rest = match rest.split_once(" for ") {
        Some((_, self_type)) => self_type,
        None => rest,
    };
    leading_name(rest)
}

/// The trait an `impl … for` line implements: `impl<K> WatchApi for Api<K>` → WatchApi.
fn impl_trait_name(line: &str) -> String {
    let before_for = line.split(" for ").next().unwrap_or_default();
    leading_name(past_generics(
        before_for.strip_prefix("impl").unwrap_or_default(),
    ))
}

/// `text` past the generic parameters it starts with, if any: `<K: Clone> Foo<K>` → ` Foo<K>`.
fn past_generics(text: &str) -> &str {
    if text.starts_with('<') {
        let mut depth = 0;
        for (at, c) in text.char_indices() {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                return &text[at + 1..];
            }
        }
    }
    text
}

/// The name `text` starts with, after any spaces: ` Foo<K> {` → Foo.
fn leading_name(text: &str) -> String {
    text.trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Records a declaration that has been read whole.
fn finish(
    items: &mut Vec<Item>,
    block: &Block,
    depth: usize,
    text: String,
    attributes: &mut Vec<String>,
) {
    let text = signature(&text);
    let attributes = std::mem::take(attributes);
    let item = if depth == 0 {
        if text.starts_with("impl") {
            let owner = impl_self_type(&text);
            if !text.contains(" for ") {
                return; // an inherent impl: its methods are recorded one by one
            }
            Item::TraitImpl { owner, text }
        } else if text.starts_with("pub fn ")
            || text.starts_with("pub async fn ")
            || text.starts_with("pub const ")
        {
            Item::Function { text }
        } else {
            let kind = ["struct", "enum", "trait", "type", "const", "static"]
                .into_iter()
                .find(|kind| text.starts_with(&format!("pub {kind} ")))
                .unwrap();
            let (Block::Struct(name) | Block::Enum(name) | Block::Trait(name)) = open_block(&text)
            else {
                // `pub type` aliases, consts and statics
                let name = declared_name(&text);
                items.push(Item::Declaration {
                    kind,
                    name,
                    text,
                    attributes,
                });
                return;
            };
            Item::Declaration {
                kind,
                name,
                text,
                attributes,
            }
        }
    } else {
        match block {
            Block::Impl(owner) => Item::Method {
                owner: owner.clone(),
                text,
                attributes,
            },
            Block::Struct(owner) | Block::Enum(owner) | Block::Trait(owner) => Item::Member {
                owner: owner.clone(),
                text,
            },
            Block::Other => return,
        }
    };
    items.push(item);
}

/// The name a declaration introduces: `pub const FOO: &str` → `FOO`.
fn declared_name(text: &str) -> String {
    let rest = text
        .split_whitespace()
        .skip_while(|word| {
            [
                "pub", "async", "fn", "type", "const", "static", "struct", "enum", "trait",
            ]
            .contains(word)
        })
        .collect::<Vec<_>>()
        .join(" ");
    rest.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// A declaration up to its body, on one line: `pub fn id(&self) -> u64`; a const or static up
/// to its type (its value is not part of the surface).
fn signature(text: &str) -> String {
    if text.starts_with("pub const ") || text.starts_with("pub static ") {
        let end = text.find(" = ").unwrap_or(text.len());
        let text = text[..end].trim().trim_end_matches(';');
        return text.split_whitespace().collect::<Vec<_>>().join(" ");
    }
    let end = text.find('{').unwrap_or(text.len());
    let text = text[..end].trim().trim_end_matches([';', ',']);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The line with string and char literals emptied and `//` comments removed, so that braces
/// inside them do not count.
fn strip_strings_and_comments(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_string = false;
                    out.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push('"');
            }
            '/' if chars.peek() == Some(&'/') => break,
            '\'' => {
                // A char literal ('{', '\n') or a lifetime ('a, '_, 'static).
                let rest: String = chars.clone().take(3).collect();
                if rest.chars().nth(1) == Some('\'') {
                    chars.nth(1);
                    out.push_str("' '");
                } else if rest.starts_with('\\') {
                    for next in chars.by_ref() {
                        if next == '\'' {
                            break;
                        }
                    }
                    out.push_str("' '");
                } else {
                    out.push('\'');
                }
            }
            _ => out.push(c),
        }
    }
    out
}
