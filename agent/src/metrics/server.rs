//! The smallest HTTP/1.1 server that serves `/metrics` to Prometheus, one request per
//! connection. It runs on a thread of its own (`keep`'s metrics thread), never in the loop that
//! restores the conflist: a network peer must never hold up the restore.
//!
//! A slow client costs only itself: every connection is answered on a short-lived thread of
//! its own, within one deadline for the whole exchange ([`CONNECTION_DEADLINE`]: reading the
//! request and writing the answer together, not per `read`), and at most
//! [`MAX_CONNECTIONS`] are served at once; past that a new connection is closed at once.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one connection may take, from accept to the last byte of the answer.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(2);
/// The most connections served at once (a Prometheus server or two scrape a node).
pub const MAX_CONNECTIONS: usize = 8;
/// The most of a request head read.
const MAX_REQUEST: usize = 8192;

/// What answers a request: its method and path in, the reply out. Shared by the connection
/// threads.
pub type Answer = Arc<dyn Fn(&str, &str) -> Reply + Send + Sync>;

pub struct Server {
    listener: TcpListener,
    /// Connections being served now.
    active: Arc<AtomicUsize>,
}

/// What a request gets.
pub struct Reply {
    pub status: &'static str,
    pub content_type: &'static str,
    pub body: String,
}

impl Server {
    /// Listens on `address` (`HOST:PORT`, e.g. `0.0.0.0:9709` or `127.0.0.1:0`).
    pub fn bind(address: &str) -> io::Result<Server> {
        let addr = address.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to listen on")
        })?;
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            active: Arc::new(AtomicUsize::new(0)),
        })
    }

    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Accepts every connection waiting now and answers each on a thread of its own; returns
    /// at once. A connection past [`MAX_CONNECTIONS`] is closed unanswered.
    pub fn accept_pending(&self, answer: &Answer) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => self.dispatch(stream, answer),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    fn dispatch(&self, stream: TcpStream, answer: &Answer) {
        let deadline = Instant::now() + CONNECTION_DEADLINE;
        let Some(slot) = Slot::take(&self.active) else {
            return; // Dropped: closed at once.
        };
        let answer = Arc::clone(answer);
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                let _slot = slot;
                let _ = serve(stream, deadline, &*answer);
            });
        // No thread to be had: the connection (moved into the closure) is closed unanswered.
        drop(spawned);
    }
}

/// One of the [`MAX_CONNECTIONS`] places, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(active: &Arc<AtomicUsize>) -> Option<Slot> {
        active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_CONNECTIONS).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(active)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection deadline passed")
}

/// The time left before `deadline`, as a socket timeout (never zero, which means "none").
fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out());
    }
    Ok(left)
}

fn serve(
    mut stream: TcpStream,
    deadline: Instant,
    answer: &dyn Fn(&str, &str) -> Reply,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        stream.set_read_timeout(Some(left(deadline)?))?;
        let n = stream.read(&mut buf)?;
        if n == 0 || head.len() + n > MAX_REQUEST {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut words = text.lines().next().unwrap_or("").split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let reply = match method {
        "GET" | "HEAD" => answer(method, path),
        _ => Reply {
            status: "405 Method Not Allowed",
            content_type: "text/plain; charset=utf-8",
            body: "only GET and HEAD\n".to_owned(),
        },
    };
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.status,
        reply.content_type,
        reply.body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(reply.body.as_bytes());
    }
    let mut rest = &out[..];
    while !rest.is_empty() {
        stream.set_write_timeout(Some(left(deadline)?))?;
        match stream.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn answer() -> Answer {
        Arc::new(|_: &str, path: &str| {
            if path == "/metrics" {
                Reply {
                    status: "200 OK",
                    content_type: "text/plain; version=0.0.4",
                    body: "x 1\n".to_owned(),
                }
            } else {
                Reply {
                    status: "404 Not Found",
                    content_type: "text/plain",
                    body: String::new(),
                }
            }
        })
    }

    /// Serves on a thread of its own until the test ends.
    fn serving() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let server = Server::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let active = Arc::clone(&server.active);
        let answer = answer();
        std::thread::spawn(move || loop {
            crate::daemon::poll_readable(&[server.as_fd()], Some(Duration::from_millis(50)))
                .unwrap();
            server.accept_pending(&answer);
        });
        (addr, active)
    }

    #[test]
    fn answers_get_and_refuses_other_methods() {
        let (addr, _) = serving();
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n");
        let other = get(addr, "GET /other?x=1 HTTP/1.0\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nx 1\n"), "{ok}");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    }

    #[test]
    fn accepting_never_waits_for_a_client() {
        let server = Server::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        crate::daemon::poll_readable(&[server.as_fd()], Some(Duration::from_secs(5))).unwrap();
        let start = Instant::now();
        server.accept_pending(&answer());
        // The silent client is someone else's thread now; the caller went on at once.
        assert!(start.elapsed() < CONNECTION_DEADLINE);
        assert_eq!(server.active.load(Ordering::Acquire), 1);
    }

    /// One byte every 0.4 s resets a per-read timeout forever; the connection's deadline
    /// still ends it.
    #[test]
    fn a_trickling_client_is_cut_off_at_the_connection_deadline() {
        let (addr, active) = serving();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let start = Instant::now();
        let trickle = std::thread::spawn({
            let mut s = s.try_clone().unwrap();
            move || {
                for b in b"GET /metrics HTTP/1.1\r\nHost: a-very-long-host-name\r\n" {
                    if s.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(400));
                }
            }
        });
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let took = start.elapsed();
        assert!(out.is_empty(), "{:?}", String::from_utf8_lossy(&out));
        // Closed by the server while the client still had most of its request to send.
        assert!(took < Duration::from_secs(20), "took {took:?}");
        let _ = s.shutdown(std::net::Shutdown::Both);
        trickle.join().unwrap();
        let start = Instant::now();
        while active.load(Ordering::Acquire) != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a slot was never given back"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn past_the_cap_a_connection_is_closed_and_the_rest_still_served() {
        let (addr, active) = serving();
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let start = Instant::now();
        while active.load(Ordering::Acquire) < MAX_CONNECTIONS {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "idle clients not accepted"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Every place is taken: the next connection is closed without an answer.
        let mut extra = TcpStream::connect(addr).unwrap();
        let _ = extra.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
        let mut out = Vec::new();
        let _ = extra.read_to_end(&mut out);
        assert!(out.is_empty(), "{:?}", String::from_utf8_lossy(&out));
        // The idle ones meet their deadline and give their places back: served again.
        drop(idle);
        let start = Instant::now();
        while active.load(Ordering::Acquire) != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "slots never given back"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let ok = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    }
}
