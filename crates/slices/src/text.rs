//! Compact text for the cached objects: shared strings, uids and versions packed into a few
//! bytes, and label maps as sorted arrays.
//!
//! At 10k Services and 50k workloads, the full API objects cost about 170 MB of heap, most of it
//! in empty `Option` fields, one B-tree node (~540 bytes) per label map and one allocation per
//! string (docs/benchmarks-journal.md, "Scale and memory with caches of API objects"). These types
//! hold the same values in a fraction of that.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A shared string: names, namespaces, label keys and values. Clones share one allocation, and
/// an [`Intern`] makes equal strings of different objects share it too.
pub type Text = Arc<str>;

/// Turns a string into a shared [`Text`], ideally the one already held for an equal string.
pub trait Intern {
    /// The shared copy of `text`.
    fn intern(&self, text: &str) -> Text;
}

/// No sharing between objects: every string gets its own allocation (tests, tools).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoIntern;

/// An opaque API token (a uid or a resourceVersion) packed when it has a usual form: a
/// lowercase UUID in 16 bytes, a decimal number in 8, anything else as text. Two tokens are
/// equal exactly when their texts are.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Token {
    /// A lowercase, hyphenated UUID (the API server's uids).
    Uuid([u8; 16]),
    /// A decimal number without leading zeros (etcd's resourceVersions).
    Number(u64),
    /// Anything else, as found.
    Text(Box<str>),
}

/// A label (or annotation) map as an array sorted by key: one allocation instead of a B-tree
/// node per map.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(Box<[(Text, Text)]>);

// === impl NoIntern ===

impl Intern for NoIntern {
    fn intern(&self, text: &str) -> Text {
        Text::from(text)
    }
}

// === impl Token ===

impl Token {
    /// Packs `text`.
    pub fn parse(text: &str) -> Self {
        if let Some(uuid) = parse_uuid(text) {
            return Token::Uuid(uuid);
        }
        let decimal = !text.is_empty()
            && text.len() <= 19
            && text.bytes().all(|b| b.is_ascii_digit())
            && (text == "0" || !text.starts_with('0'));
        match text.parse::<u64>() {
            Ok(number) if decimal => Token::Number(number),
            _ => Token::Text(text.into()),
        }
    }

    /// Whether this is the token of `text`.
    pub fn is(&self, text: &str) -> bool {
        *self == Token::parse(text)
    }

    /// The text of the token (as `to_string`, without the formatter for plain text: this is on
    /// the path of every endpoint a plan writes).
    pub fn text(&self) -> String {
        match self {
            Token::Text(text) => String::from(&**text),
            other => other.to_string(),
        }
    }
}

/// The canonical text of an address, IPv4 without the formatter (on the path of every endpoint a
/// plan writes).
pub(crate) fn ip_text(ip: &std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let mut text = String::with_capacity(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text.push('.');
                }
                if octet >= 100 {
                    text.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    text.push(char::from(b'0' + octet / 10 % 10));
                }
                text.push(char::from(b'0' + octet % 10));
            }
            text
        }
        std::net::IpAddr::V6(v6) => v6.to_string(),
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Uuid(bytes) => {
                for (i, byte) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            Token::Number(number) => write!(f, "{number}"),
            Token::Text(text) => f.write_str(text),
        }
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// The 16 bytes of a lowercase hyphenated UUID (8-4-4-4-12 hex digits).
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let bytes = text.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut digits = bytes
        .iter()
        .enumerate()
        .filter(|(i, _)| !matches!(i, 8 | 13 | 18 | 23))
        .map(|(_, b)| *b);
    if [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
        return None;
    }
    for byte in &mut out {
        let high = hex(digits.next()?)?;
        let low = hex(digits.next()?)?;
        *byte = (high << 4) | low;
    }
    Some(out)
}

fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

// === impl Labels ===

impl Labels {
    /// Labels from a map (already sorted by key), interning keys and values.
    pub fn from_map(map: Option<&BTreeMap<String, String>>, intern: &impl Intern) -> Self {
        Labels(
            map.into_iter()
                .flatten()
                .map(|(k, v)| (intern.intern(k), intern.intern(v)))
                .collect(),
        )
    }

    /// Like [`Labels::from_map`], interning only the keys (values unique to one object, like
    /// the trigger-time annotation, would only grow the pool).
    pub fn from_map_keys(map: Option<&BTreeMap<String, String>>, intern: &impl Intern) -> Self {
        Labels(
            map.into_iter()
                .flatten()
                .map(|(k, v)| (intern.intern(k), Text::from(v.as_str())))
                .collect(),
        )
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    /// The pairs, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&Text, &Text)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no label.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The map as the API spells it (`None` when empty).
    pub fn to_map(&self) -> Option<BTreeMap<String, String>> {
        (!self.is_empty()).then(|| {
            self.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_keep_their_text() {
        for text in [
            "7c3f1e2a-0b4d-4e5f-8a9b-0c1d2e3f4a5b",
            "7C3F1E2A-0B4D-4E5F-8A9B-0C1D2E3F4A5B",
            "7c3f1e2a0b4d4e5f8a9b0c1d2e3f4a5b0000",
            "12345",
            "0",
            "007",
            "18446744073709551616",
            "",
            "uid-svc-web",
        ] {
            assert_eq!(Token::parse(text).to_string(), text);
            assert!(Token::parse(text).is(text));
        }
        assert!(matches!(
            Token::parse("7c3f1e2a-0b4d-4e5f-8a9b-0c1d2e3f4a5b"),
            Token::Uuid(_)
        ));
        assert!(matches!(Token::parse("12345"), Token::Number(12345)));
        assert!(matches!(Token::parse("007"), Token::Text(_)));
    }

    #[test]
    fn addresses_print_as_the_standard_library_does() {
        for text in [
            "0.0.0.0",
            "10.0.0.1",
            "192.168.100.255",
            "1.20.3.40",
            "fd00::1",
            "::",
        ] {
            let ip: std::net::IpAddr = text.parse().unwrap();
            assert_eq!(ip_text(&ip), ip.to_string());
        }
    }

    #[test]
    fn labels_look_up_by_key() {
        let map: BTreeMap<String, String> = [("b", "2"), ("a", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let labels = Labels::from_map(Some(&map), &NoIntern);
        assert_eq!(labels.get("a"), Some("1"));
        assert_eq!(labels.get("b"), Some("2"));
        assert_eq!(labels.get("c"), None);
        assert_eq!(labels.to_map(), Some(map));
        assert_eq!(Labels::from_map(None, &NoIntern).to_map(), None);
    }
}
