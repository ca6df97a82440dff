// Colours a unified diff as kubectl diff's pager would: additions green, removals red, hunk and
// file headers cyan or bold. Without colour the text is unchanged.
import type {Palette} from './output.ts';

export function colorDiff(text: string, c: Palette): string {
  return text
    .split('\n')
    .map((line) => {
      if (line.startsWith('+++') || line.startsWith('---')) return c.bold(line);
      if (line.startsWith('@@')) return c.cyan(line);
      if (line.startsWith('+')) return c.green(line);
      if (line.startsWith('-')) return c.red(line);
      if (line.startsWith('#')) return c.bold(line);
      return line;
    })
    .join('\n');
}
