/**
 * The progress bar every `space bench` command shows on stderr (cli-progress): one bar per phase,
 * quiet when stderr is not a terminal or with `--json`, so pipes and CI logs stay clean.
 */
import cliProgress from 'cli-progress';

/** A running phase: advance it, then stop it. */
export interface Progress {
  /** Adds `n` (default 1) done units. */
  tick(n?: number): void;
  /** Ends the bar (and its line); safe to call twice. */
  stop(): void;
}

/** Makes progress bars for one command run. */
export interface ProgressFactory {
  /** A bar for `total` units of `label` (e.g. `latency c=8 warm`). */
  phase(label: string, total: number): Progress;
}

/** Bars on stderr when it is a TTY and `quiet` is false; otherwise bars that draw nothing. */
export function progressFactory(
  quiet: boolean,
  stream: NodeJS.WriteStream = process.stderr,
): ProgressFactory {
  const enabled = !quiet && stream.isTTY === true;
  return {
    phase(label, total) {
      if (!enabled) return { tick() {}, stop() {} };
      const bar = new cliProgress.SingleBar(
        {
          stream,
          format: `${label.padEnd(28)} {bar} {value}/{total} {duration_formatted}`,
          hideCursor: true,
          clearOnComplete: false,
        },
        cliProgress.Presets.shades_classic,
      );
      bar.start(total, 0);
      let stopped = false;
      return {
        tick: (n = 1) => bar.increment(n),
        stop: () => {
          if (!stopped) bar.stop();
          stopped = true;
        },
      };
    },
  };
}
