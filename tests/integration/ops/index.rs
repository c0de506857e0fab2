//! Indexing by integer tensors: `embedding`, `index_select` and `gather` pick by id, and ids past
//! the axis, negative, or of the wrong shape are errors naming them.

use super::iota;
use crate::common::{assert_fully_written, panic_message, test_pool};

#[test]
fn embedding_index_select_and_gather_pick_by_id() {
    test_pool(16).scope(|s| {
        let table = iota(s, &[5, 3]);
        let ids = s.from_slice::<i64>(&[2, 2], &[4, 0, 4, 1]);
        let e = table.embedding(&ids);
        assert_fully_written("embedding", &e);
        assert_eq!(e.shape(), &[2, 2, 3]);
        assert_eq!(
            e.to_vec(),
            [12.0, 13.0, 14.0, 0.0, 1.0, 2.0, 12.0, 13.0, 14.0, 3.0, 4.0, 5.0]
        );
        let cols = table.index_select(1, &s.from_slice::<i64>(&[2], &[2, 2]));
        assert_eq!(cols.shape(), &[5, 2]);
        assert_eq!(cols.to_vec()[..4], [2.0, 2.0, 5.0, 5.0]);

        let labels = s.from_slice::<i64>(&[5, 1], &[0, 2, 1, 1, 0]);
        let picked = table.gather(1, &labels);
        assert_eq!(picked.to_vec(), [0.0, 5.0, 7.0, 10.0, 12.0]);

        let err = table
            .try_embedding(&s.from_slice::<i64>(&[2], &[1, 5]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "embedding: index 5 is out of range for axis 0 of length 5"
        );
        let err = table
            .try_index_select(0, &s.from_slice::<i64>(&[1], &[9]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "index_select: index 9 is out of range for axis 0 of length 5"
        );
        let err = table
            .try_gather(1, &s.from_slice::<i64>(&[1, 1], &[-1]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "gather: index -1 is out of range for axis 1 of length 3"
        );
        let err = table
            .try_gather(0, &s.from_slice::<i64>(&[2], &[0, 1]))
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("gather: incompatible shapes [5, 3] and [2]"),
            "{err}"
        );
        let err = table.try_index_select(0, &ids).unwrap_err();
        assert_eq!(
            err.to_string(),
            "index_select: invalid shape [2, 2]: the ids must be 1-D"
        );
        assert_eq!(
            panic_message(|| drop(iota(s, &[3]).embedding(&ids))),
            "embedding: invalid shape [3]: the table must be 2-D ([vocab, dim])"
        );
    });
}
