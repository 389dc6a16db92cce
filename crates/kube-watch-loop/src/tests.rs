//! The watch loop by table: each case scripts the API's answers in order (pages, streams of
//! events, errors, silence) and states the events the loop yields, the requests it makes with
//! their (paused) times, and what it reports to its hooks.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod scripted;

use std::{sync::atomic::Ordering, time::Duration};

use tokio::sync::mpsc;

use self::scripted::{Answer, Counts, Line, ScriptedApi, describe, failure};
use super::*;

/// The stall bound of every case: streams are asked for a 15 s server timeout.
const BOUND: Duration = Duration::from_secs(30);

struct Case {
    name: &'static str,
    script: &'static [Answer],
    events: &'static [&'static str],
    requests: &'static [&'static str],
    /// (stalls, failures, losses) reported to the hooks; each loss makes a request (see
    /// `Counts`), so the events show which stream or list answers it.
    reported: (u32, u32, u32),
}

/// Runs `case` in paused time: reads as many events as it expects, then compares.
async fn run(case: &Case) {
    let api = ScriptedApi::new(case.script);
    let counts = Counts::default();
    let mut watch = WatchLoop::new(api.clone(), WatchConfig::new(BOUND), counts.clone());
    let mut events = Vec::new();
    for _ in case.events {
        let event = tokio::time::timeout(Duration::from_secs(3600), watch.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{}: no event within an hour after {events:?}; requests {:?}",
                    case.name,
                    api.requests.lock()
                )
            });
        events.push(describe(&event));
    }
    assert_eq!(events, case.events, "{}: events", case.name);
    assert_eq!(
        *api.requests.lock(),
        case.requests,
        "{}: requests",
        case.name
    );
    let reported = (
        counts.stalls.load(Ordering::SeqCst),
        counts.failures.load(Ordering::SeqCst),
        counts.losses.load(Ordering::SeqCst),
    );
    assert_eq!(
        reported, case.reported,
        "{}: (stalls, failures, losses)",
        case.name
    );
}

use Answer::{Fail, Page, Silent, Stream};
use Line::{Added, After, Bookmark as Mark, Deleted, Hang, ListEnd, Modified, Status as InStream};

const LISTED_A: Answer = Stream(&[Added("a", 5), ListEnd(5), Hang]);
const LISTED_A_ENDS: Answer = Stream(&[Added("a", 5), ListEnd(5)]);

#[rustfmt::skip] // one case per block, laid out as a table
const CASES: &[Case] = &[
    Case {
        name: "a streaming list, then a watch from its version; a bookmark and a stream kept to its timeout are progress",
        script: &[
            LISTED_A_ENDS,
            Stream(&[Modified("a", 7), Mark(8), After(14), Deleted("a", 9)]),
            Fail(500),
            Stream(&[Modified("a", 10), Hang]),
        ],
        // The stream opened ahead at 4 s fails: none more until this one ends, which then
        // resumes as it would without them.
        events: &[
            "list start", "listed a@5", "list done at 5 answers 0",
            "apply a@7", "progress at 8 answers 0", "delete a@9", "progress at 9 answers 0",
            "apply a@10",
        ],
        requests: &["0.0 stream-list timeout=5", "0.0 watch from=5 timeout=5", "4.0 watch from=8 timeout=5", "14.0 watch from=9 timeout=5"],
        reported: (0, 0, 0),
    },
    Case {
        name: "a bookmark inside the initial events does not end the list",
        script: &[Stream(&[Added("a", 5), Mark(5), Added("b", 6), ListEnd(6), Hang])],
        events: &["list start", "listed a@5", "listed b@6", "list done at 6 answers 0"],
        requests: &["0.0 stream-list timeout=5"],
        reported: (0, 0, 0),
    },
    Case {
        name: "a stream closed before its timeout resumes from the last version, with no progress",
        script: &[LISTED_A_ENDS, Stream(&[After(3)]), Stream(&[Modified("a", 6), Hang])],
        events: &["list start", "listed a@5", "list done at 5 answers 0", "apply a@6"],
        requests: &["0.0 stream-list timeout=5", "0.0 watch from=5 timeout=5", "3.0 watch from=5 timeout=5"],
        reported: (0, 0, 0),
    },
    Case {
        name: "410 inside the watch is a loss: list again at once, and the list answers it",
        script: &[LISTED_A_ENDS, Stream(&[InStream(410)]), Stream(&[Added("b", 20), ListEnd(20), Hang])],
        events: &["list start", "listed a@5", "list done at 5 answers 0", "list start", "listed b@20", "list done at 20 answers 1"],
        requests: &["0.0 stream-list timeout=5", "0.0 watch from=5 timeout=5", "0.0 stream-list timeout=5"],
        reported: (0, 0, 1),
    },
    Case {
        name: "410 answering the watch request: list again at once, counted as a failure",
        script: &[LISTED_A_ENDS, Fail(410), Stream(&[ListEnd(20), Hang])],
        events: &["list start", "listed a@5", "list done at 5 answers 0", "list start", "list done at 20 answers 1"],
        requests: &["0.0 stream-list timeout=5", "0.0 watch from=5 timeout=5", "0.0 stream-list timeout=5"],
        reported: (0, 1, 1),
    },
    Case {
        name: "a stalled watch is lost: it resumes from its last version at the bound as a probe; stalled again, a paged LIST answers both losses",
        // The stream opened ahead at the first one's earliest end (4 s) is never answered either.
        script: &[LISTED_A, Silent, Silent, Page(&[("b", 8)], 9, None), Stream(&[Deleted("b", 10), Hang])],
        events: &["list start", "listed a@5", "list done at 5 answers 0", "list start", "listed b@8", "list done at 9 answers 2", "delete b@10"],
        requests: &["0.0 stream-list timeout=5", "4.0 watch from=5 timeout=5", "30.0 watch from=5 timeout=3", "60.0 list limit=500", "60.0 watch from=9 timeout=3"],
        reported: (2, 0, 2),
    },
    Case {
        name: "a stall inside a streaming list re-lists with a paged LIST at once",
        script: &[Stream(&[Added("a", 5), Hang]), Page(&[("a", 5)], 6, None), Stream(&[Hang])],
        events: &["list start", "listed a@5", "list start", "listed a@5", "list done at 6 answers 1"],
        requests: &["0.0 stream-list timeout=5", "30.0 list limit=500"],
        reported: (1, 0, 1),
    },
    Case {
        name: "a refused streaming list falls back to paged lists, page by page",
        script: &[
            Fail(422),
            Page(&[("a", 3)], 9, Some("next")),
            Page(&[("b", 4)], 9, None),
            Stream(&[Modified("b", 10), Hang]),
        ],
        events: &["list start", "listed a@3", "listed b@4", "list done at 9 answers 0", "apply b@10"],
        requests: &["0.0 stream-list timeout=5", "0.0 list limit=500", "0.0 list limit=500 continue=next", "0.0 watch from=9 timeout=5"],
        reported: (0, 0, 0),
    },
    Case {
        name: "an expired continue token lists again from the first page",
        script: &[
            Fail(501),
            Page(&[("a", 3)], 9, Some("next")),
            Fail(410),
            Page(&[("a", 3), ("b", 10)], 11, None),
        ],
        events: &["list start", "listed a@3", "list start", "listed a@3", "listed b@10", "list done at 11 answers 0"],
        requests: &["0.0 stream-list timeout=5", "0.0 list limit=500", "0.0 list limit=500 continue=next", "0.0 list limit=500"],
        reported: (0, 0, 0),
    },
    Case {
        name: "a failed page is retried after the backoff from the same page",
        script: &[Fail(400), Page(&[("a", 3)], 9, Some("next")), Fail(503), Page(&[("b", 4)], 9, None)],
        events: &["list start", "listed a@3", "listed b@4", "list done at 9 answers 0"],
        requests: &["0.0 stream-list timeout=5", "0.0 list limit=500", "0.0 list limit=500 continue=next", "0.2 list limit=500 continue=next"],
        reported: (0, 1, 1),
    },
    Case {
        name: "failing requests back off, doubling; an event resets the backoff",
        script: &[
            Fail(500), Fail(500), Fail(500), LISTED_A_ENDS,
        ],
        events: &["list start", "list start", "list start", "list start", "listed a@5", "list done at 5 answers 3"],
        requests: &[
            "0.0 stream-list timeout=5", "0.2 stream-list timeout=5", "0.6 stream-list timeout=5",
            "1.4 stream-list timeout=5",
        ],
        reported: (0, 3, 3),
    },
    Case {
        name: "after a reset the next failure waits the first delay again",
        script: &[Fail(500), Fail(500), LISTED_A_ENDS, Fail(503), Stream(&[Modified("a", 6), Hang])],
        events: &["list start", "list start", "list start", "listed a@5", "list done at 5 answers 2", "apply a@6"],
        requests: &["0.0 stream-list timeout=5", "0.2 stream-list timeout=5", "0.6 stream-list timeout=5", "0.6 watch from=5 timeout=3", "0.8 watch from=5 timeout=3"],
        reported: (0, 3, 3),
    },
    Case {
        name: "an error status inside a watch is a loss: it resumes from the last version after the backoff, as a probe",
        script: &[LISTED_A_ENDS, Stream(&[Modified("a", 6), InStream(500)]), Stream(&[Modified("a", 7), Hang])],
        events: &["list start", "listed a@5", "list done at 5 answers 0", "apply a@6", "apply a@7"],
        requests: &["0.0 stream-list timeout=5", "0.0 watch from=5 timeout=5", "0.2 watch from=6 timeout=3"],
        reported: (0, 1, 1),
    },
    Case {
        name: "an error status inside a streaming list lists again after the backoff",
        script: &[Stream(&[Added("a", 5), InStream(500)]), Stream(&[Added("a", 5), ListEnd(6), Hang])],
        events: &["list start", "listed a@5", "list start", "listed a@5", "list done at 6 answers 1"],
        requests: &["0.0 stream-list timeout=5", "0.2 stream-list timeout=5"],
        reported: (0, 1, 1),
    },
    Case {
        name: "a streaming list refused inside its stream falls back to paged lists",
        script: &[Stream(&[InStream(422)]), Page(&[("a", 3)], 4, None), Stream(&[Hang])],
        events: &["list start", "list start", "listed a@3", "list done at 4 answers 0"],
        requests: &["0.0 stream-list timeout=5", "0.0 list limit=500"],
        reported: (0, 0, 0),
    },
    Case {
        name: "a stream on time (its closing bookmark read two seconds before its timeout) gets no stream ahead",
        script: &[
            LISTED_A_ENDS,
            Stream(&[Modified("a", 7), After(3), Mark(8), After(2)]),
            Stream(&[Modified("a", 9), Hang]),
        ],
        events: &[
            "list start", "listed a@5", "list done at 5 answers 0",
            "apply a@7", "progress at 8 answers 0", "progress at 8 answers 0", "apply a@9",
        ],
        requests: &["0.0 stream-list timeout=5", "0.0 watch from=5 timeout=5", "5.0 watch from=8 timeout=5"],
        reported: (0, 0, 0),
    },
    Case {
        name: "a late stream: the next is opened at its earliest end from the last version read, and takes over when it ends, each event read once",
        script: &[
            LISTED_A_ENDS,
            // Frames late: the closing bookmark is not read by 4 s, and the server's end (5 s)
            // reaches the loop at 9 s.
            Stream(&[Modified("a", 7), Mark(8), After(9), Deleted("a", 9)]),
            // Opened at 4 s: the server sends what the first sends after 8, and what follows.
            Stream(&[Deleted("a", 9), Mark(9), Modified("a", 10), Mark(11), Hang]),
        ],
        events: &[
            "list start", "listed a@5", "list done at 5 answers 0",
            "apply a@7", "progress at 8 answers 0", "delete a@9", "progress at 9 answers 0",
            "progress at 9 answers 0", "apply a@10", "progress at 11 answers 0",
        ],
        // At 8 s the stream ahead reaches its own earliest end, and the next is opened.
        requests: &["0.0 stream-list timeout=5", "0.0 watch from=5 timeout=5", "4.0 watch from=8 timeout=5", "8.0 watch from=8 timeout=5"],
        reported: (0, 0, 0),
    },
];

#[tokio::test(start_paused = true)]
async fn the_loop_answers_each_scripted_api_as_its_table_says() {
    for case in CASES {
        run(case).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_probe_restarts_the_watch_with_a_short_timeout_and_a_relist_pages() {
    let api = ScriptedApi::new(&[
        LISTED_A,
        Stream(&[Mark(6), Hang]),
        Page(&[("a", 5)], 7, None),
        Stream(&[Hang]),
    ]);
    let counts = Counts::default();
    let (commands, receiver) = mpsc::unbounded_channel();
    let mut watch = WatchLoop::new(api.clone(), WatchConfig::new(BOUND), counts.clone())
        .with_commands(receiver);
    for _ in 0..3 {
        watch.next().await;
    }
    counts.latest_request.store(1, Ordering::SeqCst);
    commands.send(Command::Probe(1)).unwrap();
    assert_eq!(describe(&watch.next().await), "progress at 6 answers 1");
    counts.latest_request.store(2, Ordering::SeqCst);
    commands.send(Command::Relist(2)).unwrap();
    let mut relisted = Vec::new();
    for _ in 0..3 {
        relisted.push(describe(&watch.next().await));
    }
    assert_eq!(
        relisted,
        ["list start", "listed a@5", "list done at 7 answers 2"]
    );
    assert_eq!(
        *api.requests.lock(),
        [
            "0.0 stream-list timeout=5",
            "0.0 watch from=5 timeout=3",
            "0.0 list limit=500",
        ]
    );
    assert_eq!(counts.listings.load(Ordering::SeqCst), 2);
    assert_eq!(counts.pages.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn selectors_and_timeouts_reach_the_requests() {
    let config = WatchConfig::new(Duration::from_secs(8))
        .labels("app=web")
        .fields("metadata.name=lease");
    let list = config.list_params(500, Some("token"));
    assert_eq!(list.label_selector.as_deref(), Some("app=web"));
    assert_eq!(list.field_selector.as_deref(), Some("metadata.name=lease"));
    assert_eq!(list.continue_token.as_deref(), Some("token"));
    let watch = config.watch_params(None);
    assert_eq!(watch.label_selector.as_deref(), Some("app=web"));
    assert_eq!(watch.field_selector.as_deref(), Some("metadata.name=lease"));
    assert_eq!(watch.timeout, Some(PROBE_TIMEOUT_SECONDS));
    assert!(watch.bookmarks, "bookmarks are signs of life");
}

#[test]
fn the_server_timeout_is_a_sixth_of_the_stall_bound_and_at_least_the_probe_timeout() {
    assert_eq!(server_timeout(Duration::from_secs(30)), 5);
    assert_eq!(server_timeout(Duration::from_secs(60)), 10);
    assert_eq!(
        server_timeout(Duration::from_secs(10)),
        PROBE_TIMEOUT_SECONDS
    );
    assert_eq!(
        server_timeout(Duration::from_secs(2)),
        PROBE_TIMEOUT_SECONDS
    );
}

#[test]
fn only_a_rejected_streaming_watch_switches_to_paged_lists() {
    assert!(machine::refused(&failure(422)));
    assert!(machine::refused(&failure(400)));
    assert!(machine::refused(&failure(501)));
    assert!(!machine::refused(&failure(500)), "a passing failure");
    assert!(
        !machine::refused(&failure(403)),
        "not a question of the list mode"
    );
}

#[test]
fn only_numeric_versions_count() {
    assert_eq!(version_number("12345"), 12345);
    assert_eq!(version_number("opaque"), 0);
}

/// A lag longer than a stream's life: a stream ahead is opened at the newest one's earliest
/// end, until `relay::AHEAD` are open; a stall drops them all.
#[tokio::test(start_paused = true)]
async fn streams_ahead_follow_one_another_up_to_the_bound_and_a_stall_drops_them() {
    // A bound of 18 s: 3 s server timeouts, the earliest end 2 s after each start.
    let mut script = vec![LISTED_A];
    script.extend([Stream(&[Hang]); relay::AHEAD]);
    let api = ScriptedApi::new(&script);
    let counts = Counts::default();
    let mut watch = WatchLoop::new(
        api.clone(),
        WatchConfig::new(Duration::from_secs(18)),
        counts.clone(),
    );
    for _ in 0..3 {
        watch.next().await;
    }
    let ahead: Vec<String> = (1..=relay::AHEAD)
        .map(|n| format!("{}.0 watch from=5 timeout=3", 2 * n))
        .collect();
    let mut expected = vec!["0.0 stream-list timeout=3".to_string()];
    expected.extend(ahead);
    // Silent past the bound: lost, and resumed from the last version as a probe.
    expected.push("18.0 watch from=5 timeout=3".to_string());
    let next = tokio::time::timeout(Duration::from_secs(19), watch.next()).await;
    assert!(
        next.is_err(),
        "nothing to read: {:?}",
        next.map(|e| describe(&e))
    );
    assert_eq!(*api.requests.lock(), expected);
    assert_eq!(counts.stalls.load(Ordering::SeqCst), 1);
}

/// A stream ahead answers the requests made before it opened: its bookmark says so, even at a
/// version the stream before it had already given.
#[tokio::test(start_paused = true)]
async fn a_stream_ahead_answers_the_requests_made_before_it_opened() {
    let api = ScriptedApi::new(&[
        LISTED_A_ENDS,
        Stream(&[Mark(8), After(6)]),
        Stream(&[Mark(8), Hang]),
    ]);
    let counts = Counts::default();
    let mut watch = WatchLoop::new(api.clone(), WatchConfig::new(BOUND), counts.clone());
    let mut events = Vec::new();
    for _ in 0..4 {
        events.push(describe(&watch.next().await));
    }
    counts.latest_request.store(3, Ordering::SeqCst);
    for _ in 0..2 {
        events.push(describe(&watch.next().await));
    }
    assert_eq!(
        events,
        [
            "list start",
            "listed a@5",
            "list done at 5 answers 0",
            "progress at 8 answers 0",
            "progress at 8 answers 0",
            "progress at 8 answers 3",
        ]
    );
    assert_eq!(
        *api.requests.lock(),
        [
            "0.0 stream-list timeout=5",
            "0.0 watch from=5 timeout=5",
            "4.0 watch from=8 timeout=5",
        ]
    );
}
