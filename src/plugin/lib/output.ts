// How the plugin prints: data on stdout in the format asked for, colour only for people.
import {Flags} from '@oclif/core';
import {stringify as toYaml} from 'yaml';
import Table from 'cli-table3';

export const outputFormats = ['text', 'json', 'yaml', 'wide'] as const;
export type OutputFormat = (typeof outputFormats)[number];

/** outputFlag: kubectl's -o, offering the formats a command prints, text by default. */
export function outputFlag<const Formats extends readonly OutputFormat[]>(formats: Formats, summary = 'Output format.') {
  return Flags.option({char: 'o', summary, options: formats, default: 'text' as Formats[number]})();
}

/**
 * useColor follows the habits of kubectl and of every terminal program: never for machines (-o
 * json/yaml); off with NO_COLOR (any value), FORCE_COLOR=0 or TERM=dumb; on with any other
 * FORCE_COLOR; else only when the output is a terminal.
 */
export function useColor(
  format: OutputFormat,
  stream: {isTTY?: boolean} = process.stdout,
  env: Record<string, string | undefined> = process.env,
): boolean {
  if (format === 'json' || format === 'yaml') return false;
  if (env.NO_COLOR !== undefined && env.NO_COLOR !== '') return false;
  const force = env.FORCE_COLOR;
  if (force === '0' || force === 'false') return false;
  if (env.TERM === 'dumb') return false;
  if (force !== undefined && force !== '') return true;
  return Boolean(stream.isTTY);
}

/** formatData renders a value for -o json / -o yaml. */
export function formatData(value: unknown, format: 'json' | 'yaml'): string {
  return format === 'json' ? JSON.stringify(value, null, 2) + '\n' : toYaml(value);
}

/** Palette returns ANSI styles, or identity functions when colour is off. */
export function palette(color: boolean) {
  const wrap = (open: number, close: number) => (text: string) => (color ? `\u001b[${open}m${text}\u001b[${close}m` : text);
  return {
    bold: wrap(1, 22),
    dim: wrap(2, 22),
    red: wrap(31, 39),
    green: wrap(32, 39),
    yellow: wrap(33, 39),
    cyan: wrap(36, 39),
  };
}
export type Palette = ReturnType<typeof palette>;

/** Borderless, as kubectl get prints: only the three spaces between columns. */
const kubectlTableChars = {
  top: '',
  'top-mid': '',
  'top-left': '',
  'top-right': '',
  bottom: '',
  'bottom-mid': '',
  'bottom-left': '',
  'bottom-right': '',
  left: '',
  'left-mid': '',
  mid: '',
  'mid-mid': '',
  right: '',
  'right-mid': '',
  middle: '   ',
};

/** formatTable lays rows out as kubectl get does: upper-case headers, columns three spaces apart, no borders. */
export function formatTable(head: string[], rows: string[][]): string {
  const table = new Table({
    head,
    chars: kubectlTableChars,
    style: {head: [], border: [], 'padding-left': 0, 'padding-right': 0, compact: true},
  });
  table.push(...rows.map((row) => head.map((_, column) => row[column] ?? '')));
  return (
    table
      .toString()
      .split('\n')
      .map((line) => line.trimEnd())
      .join('\n') + '\n'
  );
}

/** formatAge: how long ago, as kubectl's AGE column writes it (45s, 3m12s, 5h, 2d). */
export function formatAge(ms: number): string {
  const seconds = Math.max(0, Math.floor(ms / 1000));
  if (seconds < 120) return `${seconds}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 10) return `${minutes}m${seconds % 60 ? `${seconds % 60}s` : ''}`;
  if (minutes < 180) return `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours}h`;
  return `${Math.floor(hours / 24)}d`;
}

/** formatDuration: a sync's or a call's length (850ms, 1.2s). */
export function formatDuration(ms: number): string {
  return ms < 1000 ? `${Math.round(ms)}ms` : `${(ms / 1000).toFixed(1)}s`;
}
