// How the plugin prints: data on stdout in the format asked for, colour only for people.
import {stringify as toYaml} from 'yaml';

export const outputFormats = ['text', 'json', 'yaml', 'wide'] as const;
export type OutputFormat = (typeof outputFormats)[number];

/** useColor follows kubectl/oclif habits: never for machines, NO_COLOR, or a non-terminal stdout. */
export function useColor(format: OutputFormat, stream: NodeJS.WriteStream = process.stdout): boolean {
  if (format === 'json' || format === 'yaml') return false;
  if (process.env.NO_COLOR !== undefined && process.env.NO_COLOR !== '') return false;
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
