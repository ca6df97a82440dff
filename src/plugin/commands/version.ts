import {protocolName} from '../../protocol/version.ts';
import {formatData, outputFlag} from '../lib/output.ts';
import {PluginCommand} from '../lib/plugin-command.ts';

export default class Version extends PluginCommand {
  static override summary =
    "Print the version of the proxyctl plugin (-o json: and the agent protocol it speaks; agents' versions are in status).";
  static override examples = ['<%= config.bin %> version', '<%= config.bin %> version -o json'];
  static override flags = {output: outputFlag(['text', 'json', 'yaml'])};

  async run(): Promise<void> {
    const {flags} = await this.parse(Version);
    if (flags.output === 'text') {
      this.log(this.config.version);
      return;
    }
    const data = {
      version: this.config.version,
      protocol: protocolName,
      node: process.version,
      platform: `${process.platform}/${process.arch}`,
    };
    process.stdout.write(formatData(data, flags.output));
  }
}
