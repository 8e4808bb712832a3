//! What a server left on disk: every file under its dir, and its AOF (Redis 7 multi-part AOF
//! or a single file), for the persistence tests that read or edit it.

use crate::server::Server;
use std::fs;
use std::path::{Path, PathBuf};

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl Server {
    /// All files under the server's dir (recursively), e.g. to inspect AOF files.
    pub fn files(&self) -> Vec<PathBuf> {
        fn walk(p: &Path, out: &mut Vec<PathBuf>) {
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        walk(&p, out);
                    } else {
                        out.push(p);
                    }
                }
            }
        }
        let mut v = Vec::new();
        walk(self.dir(), &mut v);
        v
    }

    /// The concatenated bytes of every AOF file (Redis 7 multi-part AOF or a single file).
    pub fn aof_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for f in self.files() {
            let name = file_name(&f);
            if name.contains(".aof") && !name.ends_with(".manifest") {
                out.extend(fs::read(&f).unwrap_or_default());
            }
        }
        out
    }

    /// The incremental AOF files' text (Redis 7 multi-part AOF), CRLF shown as spaces.
    pub fn aof_incr_text(&self) -> String {
        let mut out = String::new();
        for f in self.files() {
            if file_name(&f).ends_with(".incr.aof") {
                let text =
                    String::from_utf8_lossy(&fs::read(&f).unwrap_or_default()).replace("\r\n", " ");
                out.push_str(&text);
            }
        }
        out
    }
}
