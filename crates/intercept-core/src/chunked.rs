//! [`Chunked`]: an append-only list whose items never move.
//!
//! What a session keeps per call (its records, its episode's nodes) grows for as long as
//! the session lives. In a `Vec` each doubling allocates fresh memory and copies
//! everything before it, so an append now and then costs as much as the whole list so
//! far, and half the list's memory is spare room. Here the first chunk holds
//! [`Chunked::FIRST`] items, each next one twice as many up to [`Chunked::MOST`], and
//! later chunks [`Chunked::MOST`] each: an append never copies earlier items, a short
//! list does not reserve room for a long one, and an item is found by its index in
//! constant time.

/// An append-only list kept in chunks that are never moved (see the module docs).
#[derive(Debug)]
pub(crate) struct Chunked<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunked<T> {
    /// Items in the first chunk.
    const FIRST: usize = 8;
    /// Items in the largest chunks.
    const MOST: usize = 256;
    /// Chunks before the first of the largest: 8, 16, 32, 64, 128.
    const GROWING: usize = (Self::MOST / Self::FIRST).trailing_zeros() as usize;
    /// Items in those chunks (248).
    const BEFORE_MOST: usize = Self::MOST - Self::FIRST;

    /// Items chunk `k` holds: the layout [`Chunked::place`] reads.
    fn chunk_size(k: usize) -> usize {
        if k < Self::GROWING {
            Self::FIRST << k
        } else {
            Self::MOST
        }
    }

    /// Appends `item` and returns its index.
    pub(crate) fn push(&mut self, item: T) -> usize {
        let chunks = self.chunks.len();
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < Self::chunk_size(chunks - 1) => chunk.push(item),
            _ => {
                let mut chunk = Vec::with_capacity(Self::chunk_size(chunks));
                chunk.push(item);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
        self.len - 1
    }

    /// The number of items.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The chunk and the offset in it of item `index`.
    fn place(index: usize) -> (usize, usize) {
        if index < Self::BEFORE_MOST {
            // Chunk k starts at FIRST * (2^k - 1).
            let k = ((index + Self::FIRST) / Self::FIRST).ilog2() as usize;
            (k, index + Self::FIRST - (Self::FIRST << k))
        } else {
            let past = index - Self::BEFORE_MOST;
            (Self::GROWING + past / Self::MOST, past % Self::MOST)
        }
    }

    /// Item `index`, if there is one.
    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        let (chunk, at) = Self::place(index);
        self.chunks.get(chunk)?.get(at)
    }

    /// The items, first to last.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// Room for items in the chunks (the items' own heap memory not counted).
    pub(crate) fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }

    /// The chunks' capacities, first to last (for tests of the layout).
    #[cfg(test)]
    pub(crate) fn chunk_capacities(&self) -> Vec<usize> {
        self.chunks.iter().map(Vec::capacity).collect()
    }

    /// Where the first item lives (for tests that items never move).
    #[cfg(test)]
    pub(crate) fn first_ptr(&self) -> Option<*const T> {
        self.chunks.first().map(|c| c.as_ptr())
    }
}

impl<T> std::ops::Index<usize> for Chunked<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        match self.get(index) {
            Some(item) => item,
            None => panic!("index {index} out of a list of {}", self.len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn chunks_double_up_to_the_largest_then_stay() {
        let mut list = Chunked::default();
        for i in 0..1000 {
            assert_eq!(list.push(i), i);
        }
        assert_eq!(list.chunk_capacities(), [8, 16, 32, 64, 128, 256, 256, 256]);
        assert_eq!(list.capacity(), 1016);
        assert_eq!(list.len(), 1000);
    }

    #[test]
    fn items_never_move() {
        let mut list = Chunked::default();
        list.push(0u64);
        let first = list.first_ptr();
        for i in 1..2000 {
            list.push(i);
            assert_eq!(list.first_ptr(), first, "the first items moved at {i}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every index finds the item pushed there, also across chunk edges; an index
        /// past the end finds none.
        #[test]
        fn every_index_finds_its_item(n in 0usize..1500, probe in 0usize..2000) {
            let mut list = Chunked::default();
            for i in 0..n {
                list.push(i * 3);
            }
            for i in 0..n {
                prop_assert_eq!(list[i], i * 3);
            }
            prop_assert_eq!(list.get(probe).copied(), (probe < n).then_some(probe * 3));
            prop_assert_eq!(list.iter().copied().collect::<Vec<_>>(),
                (0..n).map(|i| i * 3).collect::<Vec<_>>());
        }
    }
}
