import { durableSuite } from "./durable.js";
import { electionSuite } from "./election.js";
import { kindsSuite } from "./kinds.js";
import { libs } from "./libs.js";
import { manySuite } from "./many.js";
import { rulesSuite } from "./rules.js";
import { coreSuite } from "./suite.js";

coreSuite(libs["ioredis"]);
kindsSuite(libs["ioredis"]);
durableSuite(libs["ioredis"]);
rulesSuite(libs["ioredis"]);
electionSuite(libs["ioredis"]);
manySuite(libs["ioredis"]);
