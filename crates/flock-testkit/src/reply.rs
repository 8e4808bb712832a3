//! Replies in a shape convenient for assertions, and one-command calls over redis-rs that
//! turn server errors into `Reply::Err` (a test asserts on them) and keep connection errors
//! apart (the server died).

/// A server reply in a shape convenient for assertions (RESP2 and RESP3).
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Double(f64),
    Bool(bool),
    /// full error text, e.g. "ERR invalid ttl" or "WRONGTYPE Operation against ..."
    Err(String),
    Other(String),
}

impl Reply {
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Nil)
    }
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn err(&self) -> Option<&str> {
        match self {
            Reply::Err(e) => Some(e),
            _ => None,
        }
    }
    pub fn is_err(&self) -> bool {
        matches!(self, Reply::Err(_))
    }
    /// Bulk or status as bytes.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b) => Some(b),
            Reply::Status(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
    pub fn string(&self) -> Option<String> {
        self.bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
    pub fn array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(a) => Some(a),
            _ => None,
        }
    }
    /// Field/value pairs of a RESP3 map or a RESP2 flat array.
    pub fn pairs(&self) -> Option<Vec<(Reply, Reply)>> {
        match self {
            Reply::Map(m) => Some(m.clone()),
            Reply::Array(a) if a.len() % 2 == 0 => {
                Some(a.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect())
            }
            _ => None,
        }
    }

    /// A reply map (RESP3 map or RESP2 flat array) as name -> value; panics on anything else.
    #[track_caller]
    pub fn named(&self) -> std::collections::HashMap<String, Reply> {
        self.pairs()
            .unwrap_or_else(|| panic!("not a map: {self:?}"))
            .into_iter()
            .map(|(k, v)| (k.string().unwrap_or_default(), v))
            .collect()
    }
}

/// [`Reply::named`] as a function (for `Option::map` and the like).
#[track_caller]
pub fn map_of(r: &Reply) -> std::collections::HashMap<String, Reply> {
    r.named()
}

fn convert(v: redis::Value) -> Reply {
    use redis::Value as V;
    match v {
        V::Nil => Reply::Nil,
        V::Int(i) => Reply::Int(i),
        V::BulkString(b) => Reply::Bulk(b),
        V::Array(a) | V::Set(a) => Reply::Array(a.into_iter().map(convert).collect()),
        V::SimpleString(s) => Reply::Status(s),
        V::Okay => Reply::Status("OK".into()),
        V::Map(m) => Reply::Map(
            m.into_iter()
                .map(|(k, v)| (convert(k), convert(v)))
                .collect(),
        ),
        V::Attribute { data, .. } => convert(*data),
        V::Double(d) => Reply::Double(d),
        V::Boolean(b) => Reply::Bool(b),
        V::VerbatimString { text, .. } => Reply::Bulk(text.into_bytes()),
        V::ServerError(e) => Reply::Err(match e.details() {
            Some(d) => format!("{} {}", e.code(), d),
            None => e.code().to_string(),
        }),
        other => Reply::Other(format!("{other:?}")),
    }
}

/// Send one command (binary-safe args); server errors become `Reply::Err`. Connection/IO
/// failures are returned as `Err` (e.g. the server died).
pub fn call_raw<A: AsRef<[u8]>>(con: &mut redis::Connection, args: &[A]) -> Result<Reply, String> {
    use redis::ConnectionLike;
    let mut cmd = redis::Cmd::new();
    for a in args {
        cmd.arg(a.as_ref());
    }
    match con.req_command(&cmd) {
        Ok(v) => Ok(convert(v)),
        Err(e) => match e.code() {
            Some(code) => Ok(Reply::Err(match e.detail() {
                Some(d) => format!("{code} {d}"),
                None => code.to_string(),
            })),
            None => Err(format!("connection error: {e}")),
        },
    }
}

/// Like `call_raw` but panics on a connection error.
pub fn call<A: AsRef<[u8]>>(con: &mut redis::Connection, args: &[A]) -> Reply {
    match call_raw(con, args) {
        Ok(r) => r,
        Err(e) => {
            let shown: Vec<String> = args.iter().map(|a| show(a.as_ref())).collect();
            panic!("{shown:?}: {e}")
        }
    }
}

/// Printable form of an argument (truncated).
pub fn show(b: &[u8]) -> String {
    let s: String = String::from_utf8_lossy(&b[..b.len().min(60)])
        .escape_debug()
        .collect();
    if b.len() > 60 {
        format!("{s}...({} bytes)", b.len())
    } else {
        s
    }
}

/// The printable form of a whole command (each argument as `show` prints it).
pub fn show_args(v: &[Vec<u8>]) -> String {
    let parts: Vec<String> = v.iter().map(|a| show(a)).collect();
    format!("{parts:?}")
}

/// Assert that `r` is not an error.
#[track_caller]
pub fn assert_ok(r: &Reply, what: &str) {
    assert!(!r.is_err(), "{what}: {r:?}");
}

/// Assert that `r` is an error whose text starts with `prefix`.
#[track_caller]
pub fn assert_err_prefix(r: &Reply, prefix: &str, what: &str) {
    match r {
        Reply::Err(e) if e.starts_with(prefix) => {}
        other => panic!("{what}: expected an error starting with {prefix:?}, got {other:?}"),
    }
}

/// Assert that `r` is an error containing `needle`.
#[track_caller]
pub fn assert_err_contains(r: &Reply, needle: &str, what: &str) {
    match r {
        Reply::Err(e) if e.contains(needle) => {}
        other => panic!("{what}: expected an error containing {needle:?}, got {other:?}"),
    }
}
