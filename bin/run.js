// Entry point of the oclif plugin; see bin/kubectl-proxyctl.
import {execute} from '@oclif/core'

await execute({dir: import.meta.url})
