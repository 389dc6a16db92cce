//! The identity digest of a slice (docs/slices.md, "Identity digest"; issue 37).
//!
//! Linkerd's destination service copies each workload's `meshTLS` identity and server name when
//! it processes a slice, and does not watch workloads afterwards. A slice whose endpoints did not
//! change would never be processed again after an identity rotation, so the slice carries a
//! digest of what a consumer copies: when that changes, the digest changes, the slice is
//! rewritten, and consumers re-read the workloads.

/// Annotation on our slices holding the digest of their endpoints' mesh identities.
///
/// The project has no registered domain of its own; the prefix is the project's name, kept in this
/// one constant (docs/slices.md).
pub const IDENTITY_DIGEST_ANNOTATION: &str = "external-endpoints.io/identity-digest";

/// 64-bit FNV-1a, written out: std's `DefaultHasher` is not specified to stay the same across
/// Rust releases, and a digest that changed with the toolchain would rewrite every slice after an
/// upgrade. FNV-1a is fixed by its definition, short enough to read here, and needs no
/// dependency; the digest detects changes and is no security boundary, so a fast
/// non-cryptographic hash is enough.
#[derive(Clone, Copy)]
struct Fnv1a(u64);

// === impl Fnv1a ===

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fnv1a(Self::OFFSET_BASIS)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// `text` then a NUL byte, so that ("ab", "c") and ("a", "bc") differ (names and identities
    /// hold no NUL).
    fn field(&mut self, text: &str) {
        self.write(text.as_bytes());
        self.write(&[0]);
    }
}

/// What a consumer copies from one workload at slice time, hashed once when the workload is
/// cached: 64-bit FNV-1a over `name NUL identity NUL serverName NUL`. A no-op pass over a
/// thousand workloads then hashes eight bytes per endpoint, not every identity again
/// (docs/benchmarks.md: the no-op pass has a 0.2 ms budget).
pub(crate) fn workload_digest(name: &str, identity: &str, server_name: &str) -> u64 {
    let mut hash = Fnv1a::new();
    hash.field(name);
    hash.field(identity);
    hash.field(server_name);
    hash.0
}

/// The digest of a slice whose endpoints' workloads have these [`workload_digest`]s, given in
/// workload-name order: 64-bit FNV-1a over each one's eight little-endian bytes, as 16 lowercase
/// hex digits.
pub(crate) fn identity_digest(workloads: impl IntoIterator<Item = u64>) -> String {
    let mut hash = Fnv1a::new();
    for workload in workloads {
        hash.write(&workload.to_le_bytes());
    }
    format!("{:016x}", hash.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, identity: &str, server_name: &str) -> String {
        identity_digest([workload_digest(name, identity, server_name)])
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference (http://www.isthe.com/chongo/tech/comp/fnv/): "" and "a".
        let mut empty = Fnv1a::new();
        empty.write(b"");
        assert_eq!(empty.0, 0xcbf2_9ce4_8422_2325);
        let mut a = Fnv1a::new();
        a.write(b"a");
        assert_eq!(a.0, 0xaf63_dc4c_8601_ec8c);
        assert_eq!(
            identity_digest([]),
            "cbf29ce484222325",
            "the placeholder's digest"
        );
    }

    #[test]
    fn digest_is_fixed_text_that_changes_with_each_copied_field() {
        let base = one("vm-1", "id-1", "sn-1");
        assert_eq!(base.len(), 16);
        assert_eq!(base, one("vm-1", "id-1", "sn-1"));
        for (name, identity, server_name) in [
            ("vm-2", "id-1", "sn-1"),
            ("vm-1", "id-2", "sn-1"),
            ("vm-1", "id-1", "sn-2"),
            // Field boundaries count.
            ("vm-1i", "d-1", "sn-1"),
        ] {
            assert_ne!(
                base,
                one(name, identity, server_name),
                "{name} {identity} {server_name}"
            );
        }
        // Two workloads swapping identities change it too.
        let pair = identity_digest([
            workload_digest("a", "x", "s"),
            workload_digest("b", "y", "s"),
        ]);
        let swapped = identity_digest([
            workload_digest("a", "y", "s"),
            workload_digest("b", "x", "s"),
        ]);
        assert_ne!(pair, swapped);
    }
}
