import {Command} from '@oclif/core'

export default class Version extends Command {
  static override description = 'Print the version of the proxyctl plugin.'
  static override examples = ['<%= config.bin %> version']

  async run(): Promise<void> {
    this.log(this.config.version)
  }
}
