//! Pins the crate's public surface: a change to it must be deliberate.
//!
//! The surface is read from the sources (stable Rust has no rustdoc JSON): every name exported
//! by `lib.rs` and the `testing` module, and for those names their declarations, derives and
//! `#[must_use]`, enum variants, public fields, trait items, public methods and trait impls.
//! It is compared with `tests/public-api.txt`. After an intended change, regenerate the file and
//! review its diff:
//!
//! ```text
//! UPDATE_PUBLIC_API=1 cargo test -p leadership --test public_api
//! ```
//!
//! The reader is deliberately simple (it follows braces, strings and comments line by line, as
//! rustfmt lays the code out), and the test fails if it finds no items, so a layout it cannot
//! read shows up as a failure, not as an empty surface.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::{
    collections::{BTreeSet, HashSet},
    path::{Path, PathBuf},
};

const SNAPSHOT: &str = "tests/public-api.txt";

#[test]
fn public_api_matches_the_snapshot() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let surface = public_surface(&root.join("src"));
    assert!(
        surface.len() > 50,
        "the reader found too little:\n{surface}"
    );
    // Every name lib.rs exports shows up: an item kind the reader does not know (a const, a
    // free function, a re-export from another crate) would otherwise drop out unseen.
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let missing: Vec<String> = exported_names(&lib)
        .into_iter()
        .filter(|name| name != "testing")
        .filter(|name| {
            !surface.lines().any(|line| {
                line.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .any(|word| word == name)
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "exported but not in the surface: {missing:?}"
    );
    let snapshot_path = root.join(SNAPSHOT);
    if std::env::var_os("UPDATE_PUBLIC_API").is_some() {
        std::fs::write(&snapshot_path, &surface).unwrap();
        return;
    }
    let snapshot = std::fs::read_to_string(&snapshot_path).unwrap_or_default();
    if snapshot != surface {
        let old: BTreeSet<&str> = snapshot.lines().collect();
        let new: BTreeSet<&str> = surface.lines().collect();
        let removed: Vec<&&str> = old.difference(&new).collect();
        let added: Vec<&&str> = new.difference(&old).collect();
        panic!(
            "the public API changed; if intended, run \
             `UPDATE_PUBLIC_API=1 cargo test -p leadership --test public_api` and commit \
             {SNAPSHOT}\nremoved: {removed:#?}\nadded: {added:#?}"
        );
    }
}

/// The surface as sorted lines.
fn public_surface(src: &Path) -> String {
    let files = rust_files(src);
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let testing = std::fs::read_to_string(src.join("testing.rs")).unwrap();
    let from_lib = exported_names(&lib);
    let test_util_only: HashSet<String> = exported_names(&testing)
        .difference(&from_lib)
        .cloned()
        .collect();
    let mut exported = from_lib;
    exported.extend(test_util_only.iter().cloned());
    // A public module (`pub mod watch`) exports what its files declare public.
    let modules = public_modules(&lib);
    let module_of = |path: &Path| {
        modules
            .iter()
            .find(|module| path.starts_with(src.join(module)))
            .cloned()
    };
    for (path, text) in &files {
        if module_of(path).is_some() {
            for item in read_items(&text_without_tests(text)) {
                if let Item::Declaration { name, .. } = item {
                    exported.insert(name);
                }
            }
        }
    }
    let mut crate_traits = HashSet::new();
    let mut lines = BTreeSet::new();
    // Re-exports of other crates' items (their declarations are not in our sources).
    for (text, tag) in [(&lib, ""), (&testing, "[test-util] ")] {
        for path in foreign_reexports(text) {
            lines.insert(format!("{tag}pub use {path}"));
        }
    }
    for (path, text) in &files {
        let items = read_items(&text_without_tests(text));
        for item in &items {
            if let Item::Declaration {
                kind: "trait",
                name,
                ..
            } = item
            {
                crate_traits.insert(name.clone());
            }
        }
        let module = module_of(path);
        for item in items {
            let in_testing = path.ends_with("testing.rs");
            if let Some((owner, line)) = item.describe(&exported, in_testing, module.as_deref()) {
                let feature = in_testing || test_util_only.contains(&owner);
                let tag = if feature { "[test-util] " } else { "" };
                let path = module
                    .as_ref()
                    .map_or(String::new(), |module| format!("{module}::"));
                lines.insert(format!("{tag}{path}{line}"));
            }
        }
    }
    // Impls of the crate's own hidden traits (the lease store, the queue read-out) are not
    // part of the surface.
    lines
        .into_iter()
        .filter(|line| {
            !crate_traits
                .iter()
                .any(|name| !exported.contains(name) && line.contains(&format!("impl {name} for")))
        })
        .map(|line| line + "\n")
        .collect()
}

fn rust_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            // A module's `tests/` folder (helpers of its unit tests) is no surface.
            if !path.ends_with("tests") {
                files.extend(rust_files(&path));
            }
        } else if path.extension().is_some_and(|ext| ext == "rs")
            && !path.ends_with("tests.rs")
            && !path.ends_with("stall_tests.rs")
        {
            let text = std::fs::read_to_string(&path).unwrap();
            files.push((path, text));
        }
    }
    files
}

/// The public modules declared in `lib.rs` other than `testing` (handled on its own).
fn public_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.trim().strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(';').trim().to_string())
        .filter(|name| name != "testing")
        .collect()
}

/// Names re-exported with `pub use` (the last segment, or the `as` rename).
fn exported_names(text: &str) -> HashSet<String> {
    let mut names = HashSet::new();
    for list in pub_use_statements(text) {
        for part in list.split([',', '{', '}']) {
            let part = part.trim();
            if part.is_empty() || part.ends_with("::") {
                continue;
            }
            let name = match part.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => part.rsplit("::").next().unwrap().trim(),
            };
            if name != "self" {
                names.insert(name.to_string());
            }
        }
    }
    for line in text.lines() {
        let line = line.trim_start();
        for kind in ["pub fn ", "pub mod "] {
            if let Some(rest) = line.strip_prefix(kind) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

/// The paths of `pub use` statements that name another crate's items (not `self::`,
/// `crate::` or `super::`).
fn foreign_reexports(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for statement in pub_use_statements(text) {
        let path: String = statement.split_whitespace().collect();
        if !["self::", "crate::", "super::"]
            .iter()
            .any(|local| path.starts_with(local))
        {
            paths.push(path);
        }
    }
    paths
}

/// What every `pub use` statement of `text` says, between `pub use ` and its `;`.
fn pub_use_statements(text: &str) -> Vec<&str> {
    let mut statements = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("pub use ") {
        let after = &rest[start + "pub use ".len()..];
        let end = after.find(';').unwrap();
        statements.push(&after[..end]);
        rest = &after[end..];
    }
    statements
}

/// Everything before the inline `#[cfg(test)] mod tests { ... }` module, if any.
fn text_without_tests(text: &str) -> String {
    match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => text[..at].to_string(),
        None => text.to_string(),
    }
}

/// One item the reader saw, with the name of what it belongs to.
#[derive(Debug)]
enum Item {
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
    fn describe(
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

fn read_items(text: &str) -> Vec<Item> {
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
