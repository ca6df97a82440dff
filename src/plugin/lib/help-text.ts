// A command's description, written in the source as it reads in its help.

/**
 * helpText: the text of a template written as prose, wrapped wherever the source likes: the lines
 * of a paragraph join with one space, and a blank line separates paragraphs, as in the printed
 * help. No quotes or "+" between the lines, and no space to remember at the end of each. Any run
 * of white space within a paragraph is one space; a backtick in the text is written \`.
 */
export function helpText(strings: TemplateStringsArray, ...values: unknown[]): string {
  const text = strings.reduce((joined, part, index) => joined + String(values[index - 1]) + part);
  return text
    .trim()
    .split(/\n\s*\n/)
    .map((paragraph) => paragraph.trim().split(/\s+/).join(' '))
    .join('\n\n');
}
