//! A minimal raw RESP2 client over one TCP socket, with pipelining. Tests use it where
//! redis-rs gets in the way (fuzzing: redis-rs refuses error lines that are not UTF-8, and
//! Redis echoes arguments in "unknown command" errors; servers under valgrind or libfaketime,
//! where a connection must be cheap and predictable); the benchmark uses it because it adds
//! almost nothing to what is measured (one buffer, one write per pipeline).

use crate::reply::Reply;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Read and write timeout of [`RawConn::connect`]: long enough for a loaded 2-core box, short
/// enough that a hung server fails the test instead of hanging it.
pub const RAW_TIMEOUT: Duration = Duration::from_secs(30);

/// The RESP encoding of one command, appended to `buf`.
pub fn encode_command<A: AsRef<[u8]>>(buf: &mut Vec<u8>, args: &[A]) {
    // write! into a Vec cannot fail
    let _ = write!(buf, "*{}\r\n", args.len());
    for a in args {
        let a = a.as_ref();
        let _ = write!(buf, "${}\r\n", a.len());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

/// The RESP encoding of one command (to write AOF files or raw sockets by hand).
pub fn resp_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_command(&mut buf, args);
    buf
}

pub struct RawConn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// Commands queued by `queue` and not yet written.
    out: Vec<u8>,
    /// Commands sent or queued whose replies have not been read.
    pending: usize,
}

impl RawConn {
    /// Connect to 127.0.0.1:`port` with [`RAW_TIMEOUT`] on reads and writes.
    pub fn connect(port: u16) -> io::Result<RawConn> {
        RawConn::connect_with_timeout(port, RAW_TIMEOUT)
    }

    pub fn connect_with_timeout(port: u16, timeout: Duration) -> io::Result<RawConn> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(RawConn {
            reader: BufReader::with_capacity(1 << 16, s.try_clone()?),
            writer: s,
            out: Vec::with_capacity(1 << 16),
            pending: 0,
        })
    }

    pub fn set_read_timeout(&self, d: Duration) -> io::Result<()> {
        self.writer.set_read_timeout(Some(d))
    }

    /// Queue a command without writing it (see `flush`): a pipeline is one write.
    pub fn queue<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        encode_command(&mut self.out, args);
        self.pending += 1;
    }

    /// Write every queued command.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.writer.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Replies still to read (for commands sent or queued).
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Send one command now (and whatever was queued before it).
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<()> {
        self.queue(args);
        self.flush()
    }

    /// Send `cmds` in one write and read their replies.
    pub fn pipeline<A: AsRef<[u8]>>(&mut self, cmds: &[Vec<A>]) -> io::Result<Vec<Reply>> {
        for cmd in cmds {
            self.queue(cmd);
        }
        self.flush()?;
        cmds.iter().map(|_| self.read_reply()).collect()
    }

    /// Send one command and read one reply.
    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Reply> {
        self.send(args)?;
        self.read_reply()
    }

    fn line(&mut self) -> io::Result<Vec<u8>> {
        let mut l = Vec::new();
        let n = self.reader.read_until(b'\n', &mut l)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        if !l.ends_with(b"\r\n") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "line without CRLF",
            ));
        }
        l.truncate(l.len() - 2);
        Ok(l)
    }

    /// Read the next reply (of a command sent before, or a push message).
    pub fn read_reply(&mut self) -> io::Result<Reply> {
        self.pending = self.pending.saturating_sub(1);
        self.read_value()
    }

    fn read_value(&mut self) -> io::Result<Reply> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let l = self.line()?;
        if l.is_empty() {
            return Err(bad("empty reply line"));
        }
        let rest = &l[1..];
        let num = || -> io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("bad number"))
        };
        match l[0] {
            b'+' => Ok(Reply::Status(String::from_utf8_lossy(rest).into_owned())),
            b'-' => Ok(Reply::Err(String::from_utf8_lossy(rest).into_owned())),
            b':' => Ok(Reply::Int(num()?)),
            b'$' => {
                let n = num()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let mut b = vec![0u8; n as usize + 2];
                self.reader.read_exact(&mut b)?;
                b.truncate(n as usize);
                Ok(Reply::Bulk(b))
            }
            b'*' => {
                let n = num()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.read_value()?);
                }
                Ok(Reply::Array(v))
            }
            _ => Err(bad("unknown reply type")),
        }
    }
}
