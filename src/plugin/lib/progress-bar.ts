// A progress bar on stderr for work that may take seconds (a behaviour diff of a large node): only
// on a terminal, and only once the work has run for a second, so quick runs and pipes stay quiet.
const delayMs = 1000;
const width = 30;

export interface ProgressBar {
  update(done: number, total: number): void;
  /** Clears the bar's line, if one was drawn. */
  end(): void;
}

export function progressBar(label: string, stream: NodeJS.WriteStream = process.stderr, now: () => number = Date.now): ProgressBar {
  const started = now();
  let drawn = false;
  return {
    update(done, total) {
      if (!stream.isTTY || now() - started < delayMs || total === 0) return;
      const filled = Math.round((done / total) * width);
      stream.write(
        `\r[${'#'.repeat(filled)}${' '.repeat(width - filled)}] ${done.toLocaleString('en-US')}/${total.toLocaleString('en-US')} ${label}`,
      );
      drawn = true;
    },
    end() {
      if (drawn) stream.write('\r\u001b[K');
      drawn = false;
    },
  };
}
