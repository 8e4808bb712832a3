import { libs } from "./libs.js";
import { peerBugsSuite } from "./peer-bugs.js";

for (const lib of Object.values(libs)) peerBugsSuite(lib);
