/**
 * Entry point of the Pulumi program (`main` in Pulumi.yaml). Pulumi calls the default export and
 * publishes what it returns as the stack outputs.
 */
import { run } from './program.ts';

export default async () => run();
