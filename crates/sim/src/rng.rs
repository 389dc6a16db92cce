//! The one source of randomness of a simulation: everything random (the schedule, the
//! answers a fault picks, generated names) comes from a seed, so a seed replays exactly.

use std::time::Duration;

/// SplitMix64: tiny, fast and good enough to pick operations and faults (not cryptographic).
#[derive(Clone, Debug)]
pub struct Rng(u64);

// === impl Rng ===

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// An index into a collection of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }

    /// `true` with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (`items` must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// A duration between `low` and `high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high.saturating_sub(low) + 1))
    }

    /// An independent generator for stream `stream`, derived from this one's state without
    /// advancing it (what this generator draws next stays the same).
    pub fn derive(&self, stream: u64) -> Rng {
        Rng(self.0 ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// An independent generator derived from this one.
    pub fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_numbers_and_another_seed_others() {
        let numbers = |seed| {
            let mut rng = Rng::new(seed);
            (0..8).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(numbers(7), numbers(7));
        assert_ne!(numbers(7), numbers(8));
    }

    #[test]
    fn below_stays_below_and_covers_the_range() {
        let mut rng = Rng::new(1);
        let mut seen = [false; 5];
        for _ in 0..200 {
            let n = rng.below(5);
            assert!(n < 5);
            seen[n as usize] = true;
        }
        assert!(seen.iter().all(|seen| *seen), "{seen:?}");
        assert_eq!(rng.below(0), 0);
    }
}
