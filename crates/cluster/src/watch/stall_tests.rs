//! The watch source against a scripted HTTP server on 127.0.0.1 that keeps connections open and
//! sends nothing (a stalled proxy): the stall bound restarts the watch from its last version, and
//! a second stall re-lists with a plain LIST.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use parking_lot::Mutex;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use super::{
    health::KindHealth,
    source::{Event, Source, WatchCounters},
};

/// What the server does with the n-th request.
#[derive(Clone, Copy)]
enum Answer {
    /// Streams these lines, then keeps the connection open and silent.
    Stream(&'static [&'static str]),
    /// Never answers (not even headers), keeping the connection open.
    Silent,
    /// Answers this body in full.
    Body(&'static str),
}

/// A server answering requests in order from `script`; records each request line.
async fn serve(script: Vec<Answer>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    tokio::spawn(async move {
        let mut script = script.into_iter();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            let answer = script.next();
            tokio::spawn(async move { answer_one(stream, answer, &seen).await });
        }
    });
    (address, requests)
}

async fn answer_one(mut stream: TcpStream, answer: Option<Answer>, seen: &Mutex<Vec<String>>) {
    let mut request = Vec::new();
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await.unwrap();
        if read == 0 {
            return;
        }
        request.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&request);
    seen.lock()
        .push(text.lines().next().unwrap_or_default().to_string());
    match answer {
        Some(Answer::Stream(lines)) => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                        Transfer-Encoding: chunked\r\n\r\n";
            stream.write_all(head.as_bytes()).await.unwrap();
            for line in lines {
                let chunk = format!("{line}\n");
                let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
                stream.write_all(framed.as_bytes()).await.unwrap();
            }
        }
        Some(Answer::Body(body)) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            stream.write_all(body.as_bytes()).await.unwrap();
        }
        Some(Answer::Silent) | None => {}
    }
    // Keep the connection open and silent.
    std::future::pending::<()>().await;
}

const ADDED_A: &str = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"ns","resourceVersion":"5"},"spec":{}}}"#;
const LIST_END: &str = r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"Service","metadata":{"resourceVersion":"5","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
const MODIFIED_A: &str = r#"{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"ns","resourceVersion":"7"},"spec":{}}}"#;
const LIST: &str = r#"{"apiVersion":"v1","kind":"ServiceList","metadata":{"resourceVersion":"9"},"items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"b","namespace":"ns","resourceVersion":"8"},"spec":{}}]}"#;

async fn source(
    address: &str,
    bound: Duration,
) -> (Source<Service>, Arc<KindHealth>, WatchCounters) {
    let config = kube::Config::new(address.parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let (health, commands) = KindHealth::new("Service", bound);
    let health = Arc::new(health);
    let counters = WatchCounters::default();
    let source = Source::new(
        Api::all(client),
        None,
        health.clone(),
        commands,
        counters.clone(),
    );
    (source, health, counters)
}

fn name(event: &Event<Service>) -> String {
    match event {
        Event::Apply(object) | Event::Delete(object) | Event::Listed(object) => {
            object.metadata.name.clone().unwrap_or_default()
        }
        Event::ListStart => "list start".into(),
        Event::ListDone(position) => format!("list done at {}", position.version),
        Event::Progress(position) => format!("progress at {}", position.version),
    }
}

/// The next `n` events, each within `within`.
async fn next(source: &mut Source<Service>, n: usize, within: Duration) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..n {
        let event = tokio::time::timeout(within, source.next())
            .await
            .expect("an event within the wait");
        names.push(name(&event));
    }
    names
}

#[tokio::test]
async fn a_stalled_watch_is_resumed_from_its_last_version_once_the_bound_passes() {
    let bound = Duration::from_millis(600);
    let (address, requests) = serve(vec![
        Answer::Stream(&[ADDED_A, LIST_END]),
        Answer::Stream(&[MODIFIED_A]),
    ])
    .await;
    let (mut source, health, counters) = source(&address, bound).await;
    let listed = next(&mut source, 3, Duration::from_secs(5)).await;
    assert_eq!(listed, ["list start", "a", "list done at 5"]);
    // The stream then says nothing: after the bound the watch resumes on a new connection.
    let resumed = next(&mut source, 1, Duration::from_secs(10)).await;
    assert_eq!(resumed, ["a"], "the change after the stall arrives");
    assert_eq!(counters.stalls.get(), 1);
    let requests = requests.lock().clone();
    assert!(
        requests[0].contains("sendInitialEvents=true"),
        "{requests:?}"
    );
    assert!(
        requests[1].contains("watch=true") && requests[1].contains("resourceVersion=5"),
        "resumed from the last version read: {requests:?}"
    );
    assert!(
        !health.is_synced(),
        "the consumer marks the sync; the source only reads"
    );
}

#[tokio::test]
async fn a_watch_stalled_on_every_connection_is_relisted_with_a_plain_list() {
    let bound = Duration::from_millis(600);
    let (address, requests) = serve(vec![
        Answer::Stream(&[ADDED_A, LIST_END]),
        // The resumed watch gets no answer at all, headers included.
        Answer::Silent,
        Answer::Body(LIST),
    ])
    .await;
    let (mut source, _health, counters) = source(&address, bound).await;
    next(&mut source, 3, Duration::from_secs(5)).await;
    let relisted = next(&mut source, 3, Duration::from_secs(10)).await;
    assert_eq!(relisted, ["list start", "b", "list done at 9"]);
    assert_eq!(counters.stalls.get(), 2);
    let requests = requests.lock().clone();
    assert!(
        !requests[2].contains("watch=true") && requests[2].contains("limit=500"),
        "a paged LIST, not a watch: {requests:?}"
    );
}
