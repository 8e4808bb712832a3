import { durableSuite } from "./durable.js";
import { electionSuite } from "./election.js";
import { kindsSuite } from "./kinds.js";
import { libs } from "./libs.js";
import { manySuite } from "./many.js";
import { rulesSuite } from "./rules.js";
import { coreSuite } from "./suite.js";

coreSuite(libs["node-redis-v6"]);
kindsSuite(libs["node-redis-v6"]);
durableSuite(libs["node-redis-v6"]);
rulesSuite(libs["node-redis-v6"]);
electionSuite(libs["node-redis-v6"]);
manySuite(libs["node-redis-v6"]);
