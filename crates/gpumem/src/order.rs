//! Sorting with one small, non-generic routine.
//!
//! `slice::sort_by` is fast, but every element type and comparator instantiates its whole
//! pattern-defeating machinery again: several KB of the widgets' wasm each. The engine sorts
//! short lists (GPU counts, planner candidates, tape releases), so one stable merge sort over
//! indices serves them all.

use std::cmp::Ordering;

/// The indices `0..n` ordered by `cmp`, ties in index order (stable).
pub fn sorted_indices(n: usize, cmp: &dyn Fn(usize, usize) -> Ordering) -> Vec<usize> {
    let mut a: Vec<usize> = (0..n).collect();
    let mut b = a.clone();
    let mut width = 1;
    while width < n {
        let mut start = 0;
        while start < n {
            let mid = (start + width).min(n);
            let end = (start + 2 * width).min(n);
            let (mut l, mut r) = (start, mid);
            for slot in &mut b[start..end] {
                let take_left = l < mid && (r >= end || cmp(a[l], a[r]) != Ordering::Greater);
                if take_left {
                    *slot = a[l];
                    l += 1;
                } else {
                    *slot = a[r];
                    r += 1;
                }
            }
            start = end;
        }
        std::mem::swap(&mut a, &mut b);
        width *= 2;
    }
    a
}

/// Sort `v` by `cmp`, stably.
pub fn sort_by<T>(v: &mut [T], cmp: impl Fn(&T, &T) -> Ordering) {
    let idx = sorted_indices(v.len(), &|i, j| cmp(&v[i], &v[j]));
    // The only code per element type: the swaps, worked out without it.
    for (i, k) in swaps(idx) {
        v.swap(i, k);
    }
}

/// The swaps that put element `idx[i]` at `i` for every `i`, in order: each position takes
/// its element from where the swaps before it have moved it (following `idx` from a
/// position already filled to the one its element went to).
fn swaps(idx: Vec<usize>) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(idx.len());
    for i in 0..idx.len() {
        let mut k = idx[i];
        while k < i {
            k = idx[k];
        }
        if k != i {
            out.push((i, k));
        }
    }
    out
}

/// Sort `v` in its natural order.
pub fn sort<T: Ord>(v: &mut [T]) {
    sort_by(v, T::cmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_like_std_and_keeps_ties_in_order() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for n in [0, 1, 2, 3, 7, 8, 9, 100, 1000] {
            let v: Vec<(u8, usize)> = (0..n)
                .map(|i| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    ((s % 5) as u8, i)
                })
                .collect();
            let (mut ours, mut std) = (v.clone(), v.clone());
            sort_by(&mut ours, |a, b| a.0.cmp(&b.0));
            std.sort_by_key(|a| a.0);
            assert_eq!(ours, std, "n = {n}");
            let mut plain = v.iter().map(|p| p.1 * 7 % 13).collect::<Vec<_>>();
            let mut expect = plain.clone();
            sort(&mut plain);
            expect.sort();
            assert_eq!(plain, expect);
        }
    }
}
