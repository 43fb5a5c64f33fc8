use super::*;
use crate::allocator::Timestamp;

fn entry(namespace: &str, max: u64) -> BudgetEntry {
    BudgetEntry {
        name: None,
        namespace: Some(namespace.into()),
        queue: None,
        namespaces: Vec::new(),
        max_executors: max,
        max_pending: None,
        max_cpu: None,
        max_memory: None,
        reclaim_deadline_ms: None,
    }
}

fn claim(wanted: u64, using: u64) -> BudgetClaim {
    BudgetClaim {
        weight: 1,
        wanted,
        using,
        pending: using,
        ..BudgetClaim::default()
    }
}

fn ledger(entries: &[BudgetEntry]) -> Budgets {
    let policy = BudgetPolicy::check(entries, Some("queue"), 10).unwrap();
    Budgets::new(policy, Metrics::new())
}

#[test]
fn bad_budgets_are_refused_naming_the_key() {
    let check = |entries: &[BudgetEntry], label: Option<&str>| {
        BudgetPolicy::check(entries, label, 10).unwrap_err().0
    };
    let mut cpu = entry("c", 10);
    cpu.max_cpu = Some(Quantity("lots".into()));
    assert_eq!(
        check(&[entry("a", 1), entry("b", 1), cpu], None),
        "budgets[2].max_cpu"
    );
    let mut memory = entry("a", 10);
    memory.max_memory = Some(Quantity("0".into()));
    assert_eq!(check(&[memory], None), "budgets[0].max_memory");
    assert_eq!(check(&[entry("a", 0)], None), "budgets[0].max_executors");
    assert_eq!(check(&[entry("A_", 1)], None), "budgets[0].namespace");
    assert_eq!(
        check(&[entry("a", 1), entry("a", 2)], None),
        "budgets[1].name"
    );
    let mut queue = entry("a", 1);
    queue.namespace = None;
    queue.queue = Some("gold".into());
    // The label no longer puts anyone in a queue: the operator lists its namespaces.
    assert_eq!(
        check(std::slice::from_ref(&queue), Some("queue")),
        "budgets[0].namespaces"
    );
    queue.namespaces = vec![QueueNamespace::Name("a".into())];
    assert!(BudgetPolicy::check(std::slice::from_ref(&queue), None, 10).is_ok());
    let mut silver = queue.clone();
    silver.queue = Some("silver".into());
    silver.namespaces.push(QueueNamespace::Name("b".into()));
    assert_eq!(
        check(&[queue.clone(), silver.clone()], None),
        "budgets[1].namespaces[0]"
    );
    silver.namespaces = vec![QueueNamespace::Weighted(WeightedNamespace {
        namespace: "b".into(),
        weight: 11,
        guaranteed_executors: None,
        max_executors: None,
    })];
    assert_eq!(
        check(&[queue.clone(), silver], None),
        "budgets[1].namespaces[0].weight"
    );
    let mut again = queue.clone();
    again.name = Some("other".into());
    assert_eq!(check(&[queue.clone(), again], None), "budgets[1].queue");
    let mut listed = entry("a", 1);
    listed.namespaces = queue.namespaces.clone();
    assert_eq!(check(&[listed], None), "budgets[0].namespaces");
    queue.namespace = Some("a".into());
    assert_eq!(check(&[queue], Some("queue")), "budgets[0]");
    assert_eq!(check(&[], Some("bad key!")), "budgets_queue_label");
}

fn queue(name: &str, max: u64, namespaces: &[(&str, u32)]) -> BudgetEntry {
    BudgetEntry {
        namespace: None,
        queue: Some(name.into()),
        namespaces: (namespaces.iter())
            .map(|(namespace, weight)| {
                QueueNamespace::Weighted(WeightedNamespace {
                    namespace: namespace.to_string(),
                    weight: *weight,
                    guaranteed_executors: None,
                    max_executors: None,
                })
            })
            .collect(),
        ..entry("unused", max)
    }
}

#[test]
fn the_queue_label_may_only_name_the_namespace_queue() {
    let policy =
        BudgetPolicy::check(&[queue("gold", 10, &[("team-a", 1)])], Some("queue"), 10).unwrap();
    let label = |value: &str| BTreeMap::from([("queue".to_string(), value.to_string())]);
    assert!(policy.check_queue_label("team-a", &label("gold")).is_ok());
    assert!(policy.check_queue_label("team-a", &BTreeMap::new()).is_ok());
    let refused = policy
        .check_queue_label("team-b", &label("gold"))
        .unwrap_err();
    assert!(
        refused.contains("queue=gold") && refused.contains("team-b"),
        "{refused}"
    );
    assert!(
        policy
            .check_queue_label("team-a", &label("silver"))
            .is_err()
    );
    assert_eq!(
        policy.shard_keys(),
        BTreeMap::from([("team-a".to_string(), "queue/gold".to_string())])
    );
}

#[test]
fn a_reload_may_change_limits_and_weights_but_not_who_is_in_a_queue() {
    let check = |entries: &[BudgetEntry]| BudgetPolicy::check(entries, None, 10).unwrap();
    let budgets = Budgets::new(
        check(&[queue("gold", 10, &[("a", 1), ("b", 1)])]),
        Metrics::new(),
    );
    assert!(
        budgets
            .replace(check(&[queue("gold", 20, &[("a", 3), ("b", 1)])]))
            .is_ok()
    );
    assert_eq!(budgets.policy().budgets[0].limits.max_executors, 20);
    let (key, why) = budgets
        .replace(check(&[queue("gold", 20, &[("a", 3)])]))
        .unwrap_err();
    assert_eq!(key, "budgets[0].namespaces");
    assert!(why.contains("namespace b"), "{why}");
    assert_eq!(
        budgets.replace(check(&[])).unwrap_err().0,
        "budgets[0].namespaces"
    );
    assert_eq!(budgets.policy().budgets[0].tenants.len(), 2);
}

#[test]
fn a_queue_is_divided_by_namespace_then_by_application() {
    let budgets = ledger(&[queue("gold", 12, &[("one", 1), ("five", 1)])]);
    let five: Vec<BudgetMembership> = (0..5)
        .map(|i| budgets.join("five", &format!("app-{i}"), 10))
        .collect();
    let one = budgets.join("one", "app", 1);
    for app in five.iter().chain([&one]) {
        app.report(claim(12, 0), 0, None, 0, Timestamp(0));
    }
    let grants: Vec<u64> = (five.iter())
        .map(|app| {
            let room = app.room(claim(12, 0)).room;
            app.report(claim(12, room), 0, None, 0, Timestamp(0));
            room
        })
        .collect();
    assert_eq!(grants.iter().sum::<u64>(), 6, "{grants:?}");
    assert_eq!(one.room(claim(12, 0)).room, 6);
}

#[test]
fn three_applications_share_a_namespace_budget_and_one_ending_frees_its_share() {
    let budgets = ledger(&[entry("team", 30)]);
    let apps: Vec<BudgetMembership> = ["a", "b", "c"]
        .iter()
        .map(|app| budgets.join("team", app, 1))
        .collect();
    // Each reports what it wants before anyone asks (as after SetTotalExpected).
    for app in &apps {
        app.report(claim(30, 0), 0, None, 0, Timestamp(0));
    }
    for app in &apps {
        let grant = app.room(claim(30, 0));
        assert_eq!(grant.room, 10);
        app.report(claim(30, 10), 20, grant.bound.as_ref(), 0, Timestamp(0));
    }
    assert_eq!(apps[0].room(claim(30, 10)).room, 0);
    apps[0].report(claim(30, 10), 20, None, 0, Timestamp(0));
    let usage = &budgets.usage()[0];
    assert_eq!((usage.executors, usage.applications), (30, 3));
    let mut apps = apps;
    drop(apps.pop());
    // 15/15 now, and 10 are free: each may ask for 5 more.
    assert_eq!(apps[0].room(claim(30, 10)).room, 5);
    apps[0].report(claim(30, 15), 15, None, 0, Timestamp(0));
    assert_eq!(apps[1].room(claim(30, 10)).room, 5);
    assert_eq!(budgets.usage()[0].applications, 2);
}

#[test]
fn a_reserved_room_is_not_granted_twice() {
    let budgets = ledger(&[entry("team", 10)]);
    let a = budgets.join("team", "a", 1);
    let b = budgets.join("team", "b", 1);
    // a alone asks: it may take all that is free.
    assert_eq!(a.room(claim(10, 0)).room, 10);
    // b asks before a reported: a's room is counted as used.
    assert_eq!(b.room(claim(10, 0)).room, 0);
}

#[test]
fn queue_budgets_hold_their_namespaces_and_the_smaller_room_wins() {
    let budgets = ledger(&[entry("team", 100), queue("gold", 4, &[("gold-team", 1)])]);
    let a = budgets.join("gold-team", "a", 1);
    let b = budgets.join("team", "b", 1);
    let grant = a.room(claim(10, 0));
    assert_eq!(grant.room, 4);
    assert_eq!(grant.bound.unwrap().budget, "queue/gold");
    // The namespace budget holds b only.
    assert_eq!(b.room(claim(100, 0)).room, 100);
    let c = budgets.join("team", "c", 1);
    assert_eq!(c.room(claim(100, 0)).room, 0);
    let none = budgets.join("elsewhere", "d", 1);
    assert_eq!(none.room(claim(10, 0)).room, u64::MAX);
}

#[test]
fn weights_are_bounded_and_a_reload_takes_effect_at_the_next_ask() {
    let budgets = ledger(&[entry("team", 30)]);
    let heavy = budgets.join("team", "a", 1000);
    assert_eq!(heavy.weight(), 10);
    let light = budgets.join("team", "b", 1);
    light.report(claim(30, 0), 0, None, 0, Timestamp(0));
    heavy.report(claim(30, 0), 0, None, 0, Timestamp(0));
    // 30 × 10/11 = 27.3, 30 × 1/11 = 2.7: the extra unit goes to the larger fraction.
    assert_eq!(light.room(claim(30, 0)).room, 3);
    light.report(claim(30, 0), 0, None, 0, Timestamp(0));
    (budgets.replace(BudgetPolicy::check(&[entry("team", 44)], None, 10).unwrap()))
        .expect("no queue moves");
    // 44 × 10/11 = 40 ≥ 30: the heavy one gets its 30, the light one the 14 left.
    assert_eq!(light.room(claim(30, 0)).room, 14);
    budgets.replace(BudgetPolicy::default()).expect("no queue");
    assert_eq!(light.room(claim(30, 0)).room, u64::MAX);
}

fn bounded(
    namespace: &str,
    weight: u32,
    guaranteed: Option<u64>,
    max: Option<u64>,
) -> QueueNamespace {
    QueueNamespace::Weighted(WeightedNamespace {
        namespace: namespace.into(),
        weight,
        guaranteed_executors: guaranteed,
        max_executors: max,
    })
}

#[test]
fn guarantees_default_to_weighted_parts_of_what_the_set_ones_leave() {
    let mut gold = queue("gold", 10, &[]);
    gold.namespaces = vec![
        bounded("a", 1, None, None),
        bounded("b", 3, None, Some(7)),
        bounded("c", 1, Some(2), None),
    ];
    let policy = BudgetPolicy::check(&[gold.clone()], None, 10).unwrap();
    let budget = &policy.budgets[0];
    let of = |ns: &str| budget.bounds_of(ns);
    assert_eq!((of("a").guaranteed, of("a").max), (2, 10));
    assert_eq!((of("b").guaranteed, of("b").max), (6, 7));
    assert_eq!((of("c").guaranteed, of("c").max), (2, 10));
    assert!(budget.guaranteed && budget.reclaim_deadline_ms.is_none());
    // Neither guarantees nor reclaim: divided by weight alone, as before.
    let plain = BudgetPolicy::check(&[queue("gold", 10, &[("a", 1)])], None, 10).unwrap();
    assert!(!plain.budgets[0].guaranteed);
    assert_eq!(plain.budgets[0].bounds_of("a").guaranteed, 10);
    // A namespace budget's one tenant is guaranteed the whole budget.
    let mut reclaiming = entry("a", 6);
    reclaiming.reclaim_deadline_ms = Some(0);
    let policy = BudgetPolicy::check(&[reclaiming], None, 10).unwrap();
    assert_eq!(policy.budgets[0].bounds_of("a").guaranteed, 6);
    assert!(policy.budgets[0].guaranteed);
}

#[test]
fn bad_guarantees_and_maximums_are_refused_naming_the_key() {
    let check = |members: Vec<QueueNamespace>| {
        let mut gold = queue("gold", 8, &[]);
        gold.namespaces = members;
        BudgetPolicy::check(&[gold], None, 10).unwrap_err().0
    };
    assert_eq!(
        check(vec![
            bounded("a", 1, Some(5), None),
            bounded("b", 1, Some(4), None)
        ]),
        "budgets[0].namespaces"
    );
    assert_eq!(
        check(vec![
            bounded("a", 1, None, None),
            bounded("b", 1, Some(4), Some(3))
        ]),
        "budgets[0].namespaces[1].guaranteed_executors"
    );
    assert_eq!(
        check(vec![bounded("a", 1, None, Some(9))]),
        "budgets[0].namespaces[0].max_executors"
    );
    assert_eq!(
        check(vec![bounded("a", 1, None, Some(0))]),
        "budgets[0].namespaces[0].max_executors"
    );
}
