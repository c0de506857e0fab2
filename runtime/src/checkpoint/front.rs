//! Pareto fronts of (bytes needed, time): what `Policy::Memory`'s dynamic program keeps of each
//! state instead of a table over memory.
//!
//! A state's schedules are summed up by the fastest one for each amount of free memory: a step
//! function of the free bytes, whose steps are the points of the front, by need ascending and
//! time strictly descending. A schedule made of a choice and the schedules of sub-states needs
//! the most of what the choice holds and what each sub-state needs on top of what is held when
//! it runs (a max of sums), and takes their summed time: so a state's front is built from its
//! sub-states' fronts alone, whatever the budget, and is exact in bytes.

/// What a schedule does at a state: record the graph of the step (`All`), or advance values to
/// the step at the given position and store or hold its input (`Ck`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    All,
    Ck(usize),
}

/// One point of a front: the fastest schedule with at least `need` bytes free takes `secs`
/// (until the next point), and starts with `choice`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub(crate) need: i64,
    pub(crate) secs: f64,
    pub(crate) choice: Choice,
}

/// A point is kept only if it is faster than the point before it by more than this part of its
/// time: sums of the same measured times in another order differ in their last bits, and would
/// otherwise make points of no real gain.
const GAIN: f64 = 1e-12;

/// The fastest point of `front` that needs at most `free` bytes.
pub(crate) fn best(front: &[Point], free: i64) -> Option<&Point> {
    let fits = front.partition_point(|p| p.need <= free);
    fits.checked_sub(1).map(|i| &front[i])
}

/// The points of a choice followed by one sub-state: needing `floor` at least and `off` more
/// than the sub-state needs, and taking `base` more time than it does.
pub(crate) fn shifted(
    sub: &[Point],
    off: i64,
    floor: i64,
    base: f64,
    choice: Choice,
) -> impl Iterator<Item = Point> + '_ {
    sub.iter().map(move |p| Point {
        need: floor.max(off + p.need),
        secs: base + p.secs,
        choice,
    })
}

/// The points of a choice followed by two sub-states, `right` run holding `a` bytes more than
/// on entry and `left` holding `b` more, by need ascending: each threshold of either front
/// (shifted) at or above `floor`, with the fastest of both fronts that fits it, `base` more.
pub(crate) fn joined<'f>(
    (right, a): (&'f [Point], i64),
    (left, b): (&'f [Point], i64),
    floor: i64,
    base: f64,
    choice: Choice,
) -> Joined<'f> {
    let need = match (right.first(), left.first()) {
        (Some(r0), Some(l0)) => Some(floor.max(a + r0.need).max(b + l0.need)),
        _ => None,
    };
    Joined {
        right,
        a,
        left,
        b,
        base,
        choice,
        i: 0,
        j: 0,
        need,
    }
}

/// The points of [`joined`], made as they are read.
pub(crate) struct Joined<'f> {
    right: &'f [Point],
    a: i64,
    left: &'f [Point],
    b: i64,
    base: f64,
    choice: Choice,
    /// The fastest point of each front that fits the next need.
    i: usize,
    j: usize,
    need: Option<i64>,
}

impl Iterator for Joined<'_> {
    type Item = Point;

    fn next(&mut self) -> Option<Point> {
        let need = self.need?;
        let (right, left, a, b) = (self.right, self.left, self.a, self.b);
        while right.get(self.i + 1).is_some_and(|p| a + p.need <= need) {
            self.i += 1;
        }
        while left.get(self.j + 1).is_some_and(|p| b + p.need <= need) {
            self.j += 1;
        }
        let next_right = right.get(self.i + 1).map(|p| a + p.need);
        let next_left = left.get(self.j + 1).map(|p| b + p.need);
        self.need = match (next_right, next_left) {
            (Some(r), Some(l)) => Some(r.min(l)),
            (r, l) => r.or(l),
        };
        Some(Point {
            need,
            secs: self.base + right[self.i].secs + left[self.j].secs,
            choice: self.choice,
        })
    }
}

/// Whether `front` is at least as fast as each of `points` at its need: merging them would add
/// nothing.
pub(crate) fn beaten(front: &[Point], points: impl IntoIterator<Item = Point>) -> bool {
    let mut fits = 0;
    points.into_iter().all(|p| {
        while front.get(fits).is_some_and(|f| f.need <= p.need) {
            fits += 1;
        }
        fits > 0 && front[fits - 1].secs <= p.secs
    })
}

/// Merges `other` (points by need ascending, time descending) into `front`, keeping at each need the fastest
/// point, `front`'s among equals, only where it is faster than every point needing less.
/// `scratch` is left with what `front` held.
pub(crate) fn merge(
    front: &mut Vec<Point>,
    other: impl IntoIterator<Item = Point>,
    scratch: &mut Vec<Point>,
) {
    std::mem::swap(front, scratch);
    front.clear();
    let old = &scratch[..];
    let mut other = other.into_iter().peekable();
    let mut i = 0;
    // The fastest point of each needing at most the need reached.
    let (mut a, mut b): (Option<Point>, Option<Point>) = (None, None);
    loop {
        let need = match (old.get(i), other.peek()) {
            (Some(p), Some(q)) => p.need.min(q.need),
            (Some(p), None) => p.need,
            (None, Some(q)) => q.need,
            (None, None) => return,
        };
        while old.get(i).is_some_and(|p| p.need <= need) {
            a = Some(old[i]);
            i += 1;
        }
        while let Some(q) = other.next_if(|q| q.need <= need) {
            b = Some(q);
        }
        let best = match (a, b) {
            (Some(p), Some(q)) if q.secs < p.secs => q,
            (Some(p), _) => p,
            (None, Some(q)) => q,
            (None, None) => continue,
        };
        let gains = front
            .last()
            .is_none_or(|last| best.secs < last.secs - last.secs.abs() * GAIN);
        if gains && best.secs < f64::INFINITY {
            front.push(Point { need, ..best });
        }
    }
}

/// Whether `front` is at least as fast, at every need, as any point a choice can make that
/// needs `need` at least and takes `secs` at least.
pub(crate) fn beats(front: &[Point], need: i64, secs: f64) -> bool {
    best(front, need).is_some_and(|p| p.secs <= secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn front(points: &[(i64, f64)]) -> Vec<Point> {
        points
            .iter()
            .map(|&(need, secs)| Point {
                need,
                secs,
                choice: Choice::All,
            })
            .collect()
    }

    fn pairs(points: &[Point]) -> Vec<(i64, f64)> {
        points.iter().map(|p| (p.need, p.secs)).collect()
    }

    /// The joined front, by brute force: every pair, pruned.
    fn joined_by_pairs(r: &[Point], a: i64, l: &[Point], b: i64, floor: i64) -> Vec<(i64, f64)> {
        let mut all = Vec::new();
        for p in r {
            for q in l {
                all.push(Point {
                    need: floor.max(a + p.need).max(b + q.need),
                    secs: 1.0 + p.secs + q.secs,
                    choice: Choice::All,
                });
            }
        }
        all.sort_by(|p, q| p.need.cmp(&q.need).then(p.secs.total_cmp(&q.secs)));
        let mut out: Vec<(i64, f64)> = Vec::new();
        for p in all {
            if out.last().is_none_or(|&(_, secs)| p.secs < secs) {
                out.push((p.need, p.secs));
            }
        }
        out
    }

    #[test]
    fn joining_two_fronts_keeps_the_fastest_pair_at_each_need() {
        let r = front(&[(0, 9.0), (5, 6.0), (7, 2.0)]);
        let l = front(&[(1, 8.0), (3, 4.0), (11, 0.0)]);
        for (a, b, floor) in [(0, 0, 0), (4, -2, 3), (10, 0, 0), (-1, 7, 20), (2, 2, 6)] {
            let mut env = Vec::new();
            merge(
                &mut env,
                joined((&r, a), (&l, b), floor, 1.0, Choice::All),
                &mut Vec::new(),
            );
            assert_eq!(
                pairs(&env),
                joined_by_pairs(&r, a, &l, b, floor),
                "{a} {b} {floor}"
            );
            let lower = 1.0 + r.last().unwrap().secs + l.last().unwrap().secs;
            // The joined front's fastest point is the sum of the fastest points.
            let last = env[env.len() - 1];
            assert!(last.secs == lower && beats(&env, last.need, lower));
            assert!(!beats(&env, last.need - 1, lower));
            let again = || joined((&r, a), (&l, b), floor, 1.0, Choice::All);
            assert!(beaten(&env, again()));
            let faster = again().map(|p| Point {
                secs: p.secs - 0.5,
                ..p
            });
            assert!(!beaten(&env, faster));
        }
    }

    #[test]
    fn merging_keeps_the_points_faster_than_all_that_need_less() {
        let mut env = front(&[(2, 5.0), (4, 3.0), (6, 3.0), (9, 1.0)]);
        let mut other = front(&[(1, f64::INFINITY), (2, 4.0), (5, 3.0), (9, 1.0)]);
        other[1].choice = Choice::Ck(1);
        merge(&mut env, other.iter().copied(), &mut Vec::new());
        assert_eq!(pairs(&env), [(2, 4.0), (4, 3.0), (9, 1.0)]);
        // The faster point's choice; the first front's among equals.
        assert_eq!(env[0].choice, Choice::Ck(1));
        assert_eq!(env[2].choice, Choice::All);
        assert_eq!(best(&env, 1), None);
        assert_eq!(best(&env, 5).map(|p| p.secs), Some(3.0));
        assert_eq!(best(&env, 100).map(|p| p.secs), Some(1.0));
        assert!(beats(&env, 9, 1.0) && !beats(&env, 8, 1.0) && !beats(&env, 1, 9.0));
    }
}
