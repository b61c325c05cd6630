/**
 * The host tools the image builders run (guest-kernel.ts: apt, dpkg-deb; vm-image.ts: mkfs.ext4,
 * cpio, …), and the one error a failed step gives: DRIVER_FAILED, as the VM drivers that need
 * these images report it.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { SpaceError } from '../../core/errors.ts';

const run = promisify(execFile);

/** A DRIVER_FAILED error with `details` and, when given, its `cause`. */
export function driverFailed(
  message: string,
  details: Record<string, unknown> = {},
  cause?: unknown,
): SpaceError {
  return new SpaceError('DRIVER_FAILED', message, details, cause ? { cause } : undefined);
}

/**
 * Runs `cmd args` (in `opts.cwd`, up to 64 MiB of output); returns its stdout.
 * @throws SpaceError DRIVER_FAILED naming the command, with the last 2000 characters of its stderr.
 */
export async function sh(cmd: string, args: string[], opts: { cwd?: string } = {}): Promise<string> {
  try {
    return (await run(cmd, args, { ...opts, maxBuffer: 64 * 1024 * 1024 })).stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw driverFailed(
      `${cmd} ${args.join(' ')}: ${(e.stderr || e.message).trim().slice(-2000)}`,
      { cmd },
      err,
    );
  }
}
