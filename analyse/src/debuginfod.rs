//! Separate debug files fetched by build id from debuginfod servers
//! (`DEBUGINFOD_URLS`), into the cache the real client (elfutils'
//! libdebuginfod) uses, so that either finds what the other fetched:
//! `$DEBUGINFOD_CACHE_PATH/<build id>/debuginfo`, by default
//! `$XDG_CACHE_HOME/debuginfod_client/...` or `~/.cache/debuginfod_client/...`.
//!
//! Plain `http://` only, over `std::net::TcpStream` (HTTP/1.0, one request
//! per connection): no TLS stack and no new dependency; `https://` servers
//! are reported as unsupported. Each request has a deadline
//! (`DEBUGINFOD_TIMEOUT` seconds, default [`DEFAULT_TIMEOUT`]) for
//! connecting, sending and receiving; looking the host name up is left to
//! the system resolver and is not under it.
//!
//! Must never: fail the run (every problem is a [`FetchError`] the caller
//! turns into one warning line), or leave a partial file in the cache (a
//! download is written to a temporary name, then renamed).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Per-request deadline when `DEBUGINFOD_TIMEOUT` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where to fetch from and where to keep what was fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Server base URLs, in the order they are asked.
    pub urls: Vec<String>,
    /// The cache root: `<cache>/<hex build id>/debuginfo`.
    pub cache: PathBuf,
    /// Deadline of one request (connecting, sending and receiving).
    pub timeout: Duration,
}

/// Why a server did not give a debug file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// The URL is not `http://HOST[:PORT][/PREFIX]`.
    UnsupportedUrl { url: String, reason: &'static str },
    /// Connecting, sending or receiving failed (refused, timed out, reset).
    Io { url: String, reason: String },
    /// The server answered something other than 200 or 404.
    Status { url: String, status: String },
    /// The answer is not an HTTP response this client reads, or is cut short.
    BadResponse { url: String, reason: &'static str },
    /// The file was received but could not be stored in the cache.
    Cache { path: PathBuf, reason: String },
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::UnsupportedUrl { url, reason } => {
                write!(f, "debuginfod server {url}: {reason}")
            }
            FetchError::Io { url, reason } => write!(f, "debuginfod {url}: {reason}"),
            FetchError::Status { url, status } => {
                write!(f, "debuginfod {url}: server answered '{status}'")
            }
            FetchError::BadResponse { url, reason } => write!(f, "debuginfod {url}: {reason}"),
            FetchError::Cache { path, reason } => {
                write!(f, "debuginfod cache {}: {reason}", path.display())
            }
        }
    }
}

impl Config {
    /// The configuration the environment asks for, `None` when
    /// `DEBUGINFOD_URLS` is unset or blank.
    pub fn from_env() -> Option<Config> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let urls: Vec<String> = var("DEBUGINFOD_URLS")?
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let cache = match var("DEBUGINFOD_CACHE_PATH") {
            Some(p) => PathBuf::from(p),
            None => var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))?
                .join("debuginfod_client"),
        };
        let timeout = var("DEBUGINFOD_TIMEOUT")
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&t| t > 0)
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_TIMEOUT);
        Some(Config {
            urls,
            cache,
            timeout,
        })
    }
}

/// A parsed `http://HOST[:PORT][/PREFIX]`.
#[derive(Debug, PartialEq, Eq)]
struct Server<'a> {
    /// `HOST:PORT`, for connecting and for the Host header.
    authority: String,
    /// The path prefix, without a trailing '/'.
    prefix: &'a str,
}

fn parse_url(url: &str) -> Result<Server<'_>, FetchError> {
    let unsupported = |reason| FetchError::UnsupportedUrl {
        url: url.to_string(),
        reason,
    };
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(unsupported(if url.starts_with("https://") {
            "https is not supported (plain http:// only)"
        } else {
            "not an http:// URL"
        }));
    };
    let (host, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() || host.contains('@') {
        return Err(unsupported("no host, or a user name (not supported)"));
    }
    let port = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']').and_then(|(_, p)| p.strip_prefix(':')),
        None => host.split_once(':').map(|(_, p)| p),
    };
    let has_port = match port {
        Some(p) => {
            p.parse::<u16>().map_err(|_| unsupported("bad port"))?;
            true
        }
        None => false,
    };
    let authority = if has_port {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    Ok(Server { authority, prefix })
}

/// What one server said about one build id.
enum Answer {
    Found(Vec<u8>),
    NotFound,
}

/// Sends one GET and reads the whole answer before `deadline`.
fn get(
    url: &str,
    server: &Server<'_>,
    path: &str,
    timeout: Duration,
) -> Result<Answer, FetchError> {
    let io = |e: std::io::Error| FetchError::Io {
        url: url.to_string(),
        reason: if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            format!("no answer within {} s", timeout.as_secs_f64())
        } else {
            e.to_string()
        },
    };
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::TimedOut))
    };
    let addrs: Vec<_> = server.authority.to_socket_addrs().map_err(io)?.collect();
    let mut last = std::io::Error::from(std::io::ErrorKind::AddrNotAvailable);
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, left().map_err(io)?) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut stream = stream.ok_or_else(|| io(last))?;
    stream
        .set_write_timeout(Some(left().map_err(io)?))
        .map_err(io)?;
    let request = format!(
        "GET {}{path} HTTP/1.0\r\nHost: {}\r\nUser-Agent: igprof-analyse\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        server.prefix, server.authority
    );
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut data = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        stream
            .set_read_timeout(Some(left().map_err(io)?))
            .map_err(io)?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => data.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    parse_response(url, data)
}

fn parse_response(url: &str, mut data: Vec<u8>) -> Result<Answer, FetchError> {
    let bad = |reason| FetchError::BadResponse {
        url: url.to_string(),
        reason,
    };
    let end = data
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("answer without an HTTP header"))?;
    let head = std::str::from_utf8(&data[..end]).map_err(|_| bad("header is not text"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut words = status_line.splitn(3, ' ');
    if !words.next().is_some_and(|v| v.starts_with("HTTP/")) {
        return Err(bad("answer is not HTTP"));
    }
    let code = words.next().unwrap_or("");
    let mut length = None;
    for l in lines {
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| bad("bad Content-Length"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && !value.eq_ignore_ascii_case("identity")
        {
            return Err(bad("answer uses a transfer encoding (not supported)"));
        }
    }
    match code {
        "200" => {
            let body = data.split_off(end + 4);
            match length {
                Some(n) if body.len() < n => Err(bad("answer cut short")),
                Some(n) => Ok(Answer::Found(body[..n].to_vec())),
                None => Ok(Answer::Found(body)),
            }
        }
        "404" => Ok(Answer::NotFound),
        _ => Err(FetchError::Status {
            url: url.to_string(),
            status: status_line.split_once(' ').map_or("", |x| x.1).to_string(),
        }),
    }
}

/// Fetches debug files; remembers servers that failed, so that a server
/// that is down costs one timeout and one warning, not one per object.
#[derive(Debug)]
pub struct Client {
    config: Config,
    failed: Vec<bool>,
}

impl Client {
    pub fn new(config: Config) -> Client {
        let failed = vec![false; config.urls.len()];
        Client { config, failed }
    }

    /// The cached file for `build_id`, if any: only in a cache whose
    /// directories belong to this user and no other may write into, and
    /// only a regular file of this user, not a link (see `safefs`).
    pub fn cached(&self, build_id: &[u8]) -> Option<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.cache_dir(build_id, false).ok()?;
        let p = dir.path().join("debuginfo");
        let m = std::fs::symlink_metadata(&p).ok()?;
        (m.is_file() && m.uid() == safefs::euid()).then_some(p)
    }

    fn cache_path(&self, build_id: &[u8]) -> PathBuf {
        self.config.cache.join(hex(build_id)).join("debuginfo")
    }

    /// The cache's directory for `build_id` (`create`: made, mode 0700,
    /// where missing), its root and itself checked.
    fn cache_dir(
        &self,
        build_id: &[u8],
        create: bool,
    ) -> Result<safefs::PrivateDir, safefs::Error> {
        safefs::PrivateDir::open(&self.config.cache, create)?;
        safefs::PrivateDir::open(&self.config.cache.join(hex(build_id)), create)
    }

    /// The debug file of `build_id`: from the cache, else from the first
    /// server that has it (stored in the cache). `Ok(None)`: no server
    /// has it. Each error is returned once per server; a server that failed
    /// is not asked again.
    pub fn debuginfo(&mut self, build_id: &[u8]) -> (Option<PathBuf>, Vec<FetchError>) {
        if build_id.is_empty() {
            return (None, Vec::new());
        }
        if let Some(p) = self.cached(build_id) {
            return (Some(p), Vec::new());
        }
        let path = format!("/buildid/{}/debuginfo", hex(build_id));
        let mut errors = Vec::new();
        for (i, url) in self.config.urls.iter().enumerate() {
            if self.failed[i] {
                continue;
            }
            let answer =
                parse_url(url).and_then(|server| get(url, &server, &path, self.config.timeout));
            match answer {
                Ok(Answer::Found(data)) => match self.store(build_id, &data) {
                    Ok(p) => return (Some(p), errors),
                    Err(e) => {
                        errors.push(e);
                        return (None, errors);
                    }
                },
                Ok(Answer::NotFound) => {}
                Err(e) => {
                    self.failed[i] = true;
                    errors.push(e);
                }
            }
        }
        (None, errors)
    }

    fn store(&self, build_id: &[u8], data: &[u8]) -> Result<PathBuf, FetchError> {
        let path = self.cache_path(build_id);
        let err = |e: safefs::Error| FetchError::Cache {
            path: path.clone(),
            reason: e.to_string(),
        };
        self.cache_dir(build_id, true)
            .and_then(|dir| dir.write("debuginfo", data))
            .map_err(err)?;
        Ok(path)
    }
}

/// A build-id as the cache names it.
fn hex(build_id: &[u8]) -> String {
    build_id.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_plain_http_with_an_optional_port_and_prefix() {
        let s = parse_url("http://127.0.0.1:8002").unwrap();
        assert_eq!((s.authority.as_str(), s.prefix), ("127.0.0.1:8002", ""));
        let s = parse_url("http://debuginfod.example/sub/").unwrap();
        assert_eq!(
            (s.authority.as_str(), s.prefix),
            ("debuginfod.example:80", "/sub")
        );
        let s = parse_url("http://[::1]:9000/").unwrap();
        assert_eq!(s.authority, "[::1]:9000");
        let s = parse_url("http://[::1]/").unwrap();
        assert_eq!(s.authority, "[::1]:80");
        assert!(matches!(
            parse_url("https://debuginfod.debian.net"),
            Err(FetchError::UnsupportedUrl { reason, .. }) if reason.contains("https")
        ));
        assert!(parse_url("ftp://x").is_err());
        assert!(parse_url("http:///x").is_err());
    }

    #[test]
    fn responses_give_the_body_a_miss_or_one_error() {
        let r = |s: &str| parse_response("u", s.as_bytes().to_vec());
        assert!(matches!(
            r("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
            Ok(Answer::Found(b)) if b == b"abc"
        ));
        assert!(matches!(r("HTTP/1.1 200 OK\r\n\r\nabcd"), Ok(Answer::Found(b)) if b == b"abcd"));
        assert!(matches!(
            r("HTTP/1.0 404 Not Found\r\n\r\n"),
            Ok(Answer::NotFound)
        ));
        assert!(matches!(
            r("HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\nabc"),
            Err(FetchError::BadResponse { .. })
        ));
        assert!(matches!(
            r("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
            Err(FetchError::BadResponse { .. })
        ));
        let e = r("HTTP/1.0 503 Service Unavailable\r\n\r\n").err().unwrap();
        assert_eq!(
            e.to_string(),
            "debuginfod u: server answered '503 Service Unavailable'"
        );
        assert!(r("garbage").is_err());
    }

    #[test]
    fn a_server_that_is_down_is_one_error_then_skipped() {
        // A port nothing listens on: bind one, note it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cache = tempfile::tempdir().unwrap();
        let mut c = Client::new(Config {
            urls: vec![format!("http://127.0.0.1:{port}")],
            cache: cache.path().to_path_buf(),
            timeout: Duration::from_secs(2),
        });
        let (p, errors) = c.debuginfo(&[0xab, 0xcd]);
        assert_eq!(p, None);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0]
            .to_string()
            .starts_with("debuginfod http://127.0.0.1:"));
        let (p, errors) = c.debuginfo(&[0xab, 0xce]);
        assert_eq!((p, errors.len()), (None, 0));
        // What is cached is used without asking.
        std::fs::create_dir_all(cache.path().join("abcd")).unwrap();
        std::fs::write(cache.path().join("abcd/debuginfo"), b"x").unwrap();
        assert_eq!(
            c.debuginfo(&[0xab, 0xcd]).0,
            Some(cache.path().join("abcd/debuginfo"))
        );
    }

    #[test]
    fn a_cache_others_may_write_into_or_a_linked_file_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let cache = tempfile::tempdir().unwrap();
        let c = Client::new(Config {
            urls: Vec::new(),
            cache: cache.path().to_path_buf(),
            timeout: Duration::from_secs(2),
        });
        let victim = cache.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::create_dir(cache.path().join("abcd")).unwrap();
        std::os::unix::fs::symlink(&victim, cache.path().join("abcd/debuginfo")).unwrap();
        assert_eq!(c.cached(&[0xab, 0xcd]), None, "a link is not a cached file");
        c.store(&[0xab, 0xcd], b"debug").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(c.cached(&[0xab, 0xcd]).is_some());
        let mode = |m| std::fs::Permissions::from_mode(m);
        std::fs::set_permissions(cache.path(), mode(0o777)).unwrap();
        assert_eq!(
            c.cached(&[0xab, 0xcd]),
            None,
            "a cache others may write into"
        );
        let e = c.store(&[0xab, 0xcd], b"debug").unwrap_err();
        assert!(
            e.to_string().contains("other users may write into it"),
            "{e}"
        );
        std::fs::set_permissions(cache.path(), mode(0o700)).unwrap();
    }
}
