// Logger: one line per event on stderr, "TIME LEVEL message key=value ...", with --v deciding how
// much detail (0: events and errors; 2: each sync; 4: each command; 5: rule text).

export type LogFields = Record<string, string | number | boolean | undefined>;

export interface Logger {
  info(message: string, fields?: LogFields): void;
  warn(message: string, fields?: LogFields): void;
  error(message: string, fields?: LogFields): void;
  /** Logs at info level only when verbosity >= level. */
  detail(level: number, message: string, fields?: LogFields): void;
  readonly verbosity: number;
}

export function createLogger(options: {verbosity?: number; write?: (line: string) => void; now?: () => number} = {}): Logger {
  const verbosity = options.verbosity ?? 0;
  const write = options.write ?? ((line: string) => process.stderr.write(`${line}\n`));
  const now = options.now ?? Date.now;
  const emit = (level: string, message: string, fields: LogFields = {}) => {
    const parts = [new Date(now()).toISOString(), level, message.replace(/\n/g, ' ')];
    for (const [key, value] of Object.entries(fields)) {
      if (value === undefined) continue;
      const text = String(value);
      parts.push(`${key}=${/^[^\s"=]+$/.test(text) ? text : JSON.stringify(text)}`);
    }
    write(parts.join(' '));
  };
  return {
    verbosity,
    info: (message, fields) => emit('info', message, fields),
    warn: (message, fields) => emit('warn', message, fields),
    error: (message, fields) => emit('error', message, fields),
    detail: (level, message, fields) => {
      if (verbosity >= level) emit('info', message, fields);
    },
  };
}

/** A logger that keeps lines in memory, for tests. */
export function memoryLogger(verbosity = 0): Logger & {lines: string[]} {
  const lines: string[] = [];
  return Object.assign(createLogger({verbosity, write: (line) => lines.push(line)}), {lines});
}
