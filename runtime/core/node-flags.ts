/**
 * Node flags shared by the services on the create path (the API: API_NODE_FLAGS in
 * runtime/api/config.ts; the agent: AGENT_NODE_FLAGS in runtime/agent/config.ts).
 */

/**
 * `--no-flush-bytecode`: V8 drops the bytecode of a function that has not run through 6 full
 * collections (`--bytecode-old-age`), and with it the function's type feedback and optimised
 * code. The create path runs in bursts: between them the API and the agent keep collecting
 * (heartbeats, the watchdog, the memory reducer at idle), so each burst found much of its code
 * gone and compiled it again from source, in the interpreter and without feedback. Kept, the
 * bytecode costs memory for every function that ever ran (a few MiB in these services).
 *
 * Measured on a 2-vCPU VM (2026-12-05): `space up --warm 32` stacks without and with the flag
 * (API and agent) interleaved twice, waves of 32 one-request warm creates each 3 s after the pool
 * was full, `/proc` CPU at 10 ms resolution, medians of 10 settled waves: the slowest create of a
 * wave 118 ms without against 89 ms with, the machine's CPU per wave 245 against 195 ms.
 */
export const KEEP_BYTECODE_FLAGS = ['--no-flush-bytecode'] as const;
