// A command's description and examples, written in the source as they read in its help.

/**
 * helpText: the text of a template written as prose, wrapped wherever the source likes: the lines
 * of a paragraph join with one space, and a blank line separates paragraphs, as in the printed
 * help. No quotes or "+" between the lines, and no space to remember at the end of each. Any run
 * of white space within a paragraph is one space; a backtick in the text is written \`.
 */
export function helpText(strings: TemplateStringsArray, ...values: unknown[]): string {
  return templateText(strings, values)
    .trim()
    .split(/\n\s*\n/)
    .map((paragraph) => paragraph.trim().split(/\s+/).join(' '))
    .join('\n\n');
}

/**
 * examples: a command's examples written as kubectl writes its own, a `# description` line above
 * each command and a blank line between them. `kubectl proxyctl` in a command is oclif's
 * `<%= config.bin %>`; a command or description too long for one line goes on over the next lines.
 */
export function examples(strings: TemplateStringsArray, ...values: unknown[]): Array<{description: string; command: string}> {
  return templateText(strings, values)
    .trim()
    .split(/\n\s*\n/)
    .map((block) => {
      const lines = block.split('\n').map((line) => line.trim());
      const description = lines.filter((line) => line.startsWith('#')).map((line) => line.replace(/^#\s*/, ''));
      const command = lines.filter((line) => !line.startsWith('#'));
      if (description.length === 0 || command.length === 0) throw new Error(`an example needs a # description and a command:\n${block}`);
      return {description: description.join(' '), command: command.join(' ').replaceAll('kubectl proxyctl ', '<%= config.bin %> ')};
    });
}

function templateText(strings: TemplateStringsArray, values: unknown[]): string {
  return strings.reduce((joined, part, index) => joined + String(values[index - 1]) + part);
}
