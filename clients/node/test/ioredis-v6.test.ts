import { durableSuite } from "./durable.js";
import { electionSuite } from "./election.js";
import { kindsSuite } from "./kinds.js";
import { libs } from "./libs.js";
import { manySuite } from "./many.js";
import { rulesSuite } from "./rules.js";
import { coreSuite } from "./suite.js";

coreSuite(libs["ioredis-v6"]);
kindsSuite(libs["ioredis-v6"]);
durableSuite(libs["ioredis-v6"]);
rulesSuite(libs["ioredis-v6"]);
electionSuite(libs["ioredis-v6"]);
manySuite(libs["ioredis-v6"]);
