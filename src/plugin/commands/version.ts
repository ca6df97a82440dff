import {Flags} from '@oclif/core';
import {protocolName} from '../../protocol/version.ts';
import {formatData} from '../lib/output.ts';
import {PluginCommand} from '../lib/plugin-command.ts';

export default class Version extends PluginCommand {
  static override summary = 'Print the version of the proxyctl plugin and the agent protocol it speaks.';
  static override description = 'The agents\' versions are in "kubectl proxyctl status" (VERSION column).';
  static override examples = [
    {description: 'The version alone', command: '<%= config.bin %> version'},
    {description: 'Everything, for scripts', command: '<%= config.bin %> version -o json'},
  ];

  static override flags = {
    output: Flags.option({char: 'o', summary: 'Output format.', options: ['text', 'json', 'yaml'] as const, default: 'text'})(),
  };

  async run(): Promise<void> {
    const {flags} = await this.parse(Version);
    if (flags.output === 'text') {
      this.log(this.config.version);
      return;
    }
    const data = {version: this.config.version, protocol: protocolName, node: process.version, platform: `${process.platform}/${process.arch}`};
    process.stdout.write(formatData(data, flags.output));
  }
}
