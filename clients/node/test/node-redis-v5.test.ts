import { durableSuite } from "./durable.js";
import { electionSuite } from "./election.js";
import { kindsSuite } from "./kinds.js";
import { libs } from "./libs.js";
import { manySuite } from "./many.js";
import { rulesSuite } from "./rules.js";
import { coreSuite } from "./suite.js";

coreSuite(libs["node-redis-v5"]);
kindsSuite(libs["node-redis-v5"]);
durableSuite(libs["node-redis-v5"]);
rulesSuite(libs["node-redis-v5"]);
electionSuite(libs["node-redis-v5"]);
manySuite(libs["node-redis-v5"]);
