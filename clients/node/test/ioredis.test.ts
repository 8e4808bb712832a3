import { durableSuite } from "./durable.js";
import { kindsSuite } from "./kinds.js";
import { libs } from "./libs.js";
import { coreSuite } from "./suite.js";

coreSuite(libs["ioredis"]);
kindsSuite(libs["ioredis"]);
durableSuite(libs["ioredis"]);
