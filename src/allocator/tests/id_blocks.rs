//! Executor ids reserved in blocks: when the record is written and what it says.
use super::*;
use crate::allocator::id_block::{IdBlocks, MAX_ID_BLOCK};

/// Far more wanted than any block.
const MANY: u64 = 1_000_000;

#[test]
fn a_record_is_written_once_per_block_and_blocks_double() {
    let mut blocks = IdBlocks::new(0);
    // (highest id of a round's creates, executors still wanted, record written)
    let rounds: Vec<(u64, u64, Option<u64>)> = vec![
        (10, MANY, Some(109)),
        (20, MANY, None),
        (109, MANY, None),
        (110, MANY, Some(309)),
        (309, MANY, None),
        (310, MANY, Some(709)),
        (800, MANY, Some(1599)),
    ];
    for (highest, wanted, expected) in rounds {
        let record = blocks.to_record(highest, wanted, None);
        assert_eq!(record, expected, "creates up to {highest}");
        if let Some(up_to) = record {
            blocks.recorded(up_to);
        }
    }
    assert_eq!(blocks.reserved(), 1599);
}

#[test]
fn a_block_reaches_no_further_than_the_targets_need() {
    // (highest, still wanted, record)
    let cases = [(5, 0, 5), (10, 40, 50), (10, 99, 109), (10, 500, 109)];
    for (highest, wanted, expected) in cases {
        let blocks = IdBlocks::new(0);
        assert_eq!(
            blocks.to_record(highest, wanted, None),
            Some(expected),
            "{highest} + {wanted}"
        );
    }
}

#[test]
fn ten_thousand_executors_take_at_most_one_write_per_hundred() {
    for per_round in [5u64, 10, 50, 100, 500] {
        let mut blocks = IdBlocks::new(0);
        let mut writes = 0;
        let mut highest = 0;
        while highest < 10_000 {
            highest += per_round;
            if let Some(up_to) = blocks.to_record(highest, 10_000 - highest, None) {
                writes += 1;
                blocks.recorded(up_to);
            }
        }
        assert!(writes <= 8, "{per_round} per round: {writes} writes");
        assert!(blocks.reserved() <= 10_000);
    }
}

#[test]
fn blocks_stop_at_max_executors_and_grow_no_further_than_the_largest() {
    let blocks = IdBlocks::new(0);
    assert_eq!(blocks.to_record(10, MANY, Some(50)), Some(50));
    assert_eq!(blocks.to_record(50, MANY, Some(50)), Some(50));
    let mut blocks = IdBlocks::new(0);
    let mut highest = 1;
    for _ in 0..20 {
        let up_to = blocks.to_record(highest, MANY, None).unwrap();
        blocks.recorded(up_to);
        highest = up_to + 1;
    }
    let up_to = blocks.to_record(highest, MANY, None).unwrap();
    assert_eq!(up_to - highest + 1, MAX_ID_BLOCK);
}

#[test]
fn a_failed_write_reserves_nothing() {
    let blocks = IdBlocks::new(500);
    assert_eq!(blocks.to_record(400, MANY, None), None);
    // Asked twice without `recorded`: the same block again.
    assert_eq!(blocks.to_record(501, MANY, None), Some(600));
    assert_eq!(blocks.to_record(501, MANY, None), Some(600));
    assert_eq!(blocks.reserved(), 500);
}

#[test]
fn a_round_reports_what_the_targets_still_lack() {
    let mut a = allocator(settings(), &[(0, 25), (1, 3)]);
    let plan = a.round(snapshot(&[]), secs(0));
    // 10 + 3 created of 28 wanted.
    assert_eq!(plan.creates.len(), 13);
    assert_eq!(plan.still_wanted, 15);
    // Over target: nothing lacking.
    let mut a = allocator(settings(), &[(0, 1)]);
    let pods = [running(1, 0, 0), running(2, 0, 0)];
    let plan = a.round(snapshot(&pods), secs(0));
    assert_eq!(plan.still_wanted, 0);
}
