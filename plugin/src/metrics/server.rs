//! The smallest HTTP/1.1 server that serves `/metrics` to Prometheus: `keep` polls its listening
//! socket with its other descriptors and answers each connection at once, one request per
//! connection, with short timeouts so a slow or silent client cannot stall the keeper.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

/// How long a client may take to send its request, or to take the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(500);
/// The most of a request head read.
const MAX_REQUEST: usize = 8192;

pub struct Server {
    listener: TcpListener,
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
        Ok(Server { listener })
    }

    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Answers every connection waiting now; `answer` gets the request's method and path.
    pub fn serve_pending(&self, answer: &mut dyn FnMut(&str, &str) -> Reply) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let _ = serve(stream, answer);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }
}

fn serve(mut stream: TcpStream, answer: &mut dyn FnMut(&str, &str) -> Reply) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
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
    stream.write_all(&out)
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

    #[test]
    fn answers_get_and_refuses_other_methods() {
        let server = Server::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            (
                get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
                get(addr, "POST /metrics HTTP/1.1\r\n\r\n"),
                get(addr, "GET /other?x=1 HTTP/1.0\r\n\r\n"),
            )
        });
        let mut answer = |_: &str, path: &str| {
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
        };
        while !client.is_finished() {
            crate::sys::poll_readable(&[server.as_fd()], Some(Duration::from_millis(50))).unwrap();
            server.serve_pending(&mut answer);
        }
        let (ok, post, other) = client.join().unwrap();
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nx 1\n"), "{ok}");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    }

    #[test]
    fn a_silent_client_costs_at_most_the_timeout() {
        let server = Server::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let start = std::time::Instant::now();
        server.serve_pending(&mut |_, _| unreachable!("a silent client sends no request"));
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
