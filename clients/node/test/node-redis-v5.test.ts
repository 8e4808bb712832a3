import { libs } from "./libs.js";
import { coreSuite } from "./suite.js";

coreSuite(libs["node-redis-v5"]);
