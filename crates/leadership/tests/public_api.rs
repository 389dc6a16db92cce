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

#[path = "public_api/reader.rs"]
mod reader;

use std::{
    collections::{BTreeSet, HashSet},
    path::{Path, PathBuf},
};

use reader::{Item, read_items};

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
