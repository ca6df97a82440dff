// The first link of the handler chain: who sent the request, from its bearer token.
import type {IncomingMessage} from 'node:http';
import {anonymousUser, type UserInfo} from '../access-control.ts';
import {unauthorized} from '../api-error.ts';
import type {ServerContext} from './context.ts';

const localAdmin: UserInfo = {username: 'system:admin', groups: ['system:masters', 'system:authenticated']};

export function authenticate(context: ServerContext, req: IncomingMessage): UserInfo {
  const header = req.headers.authorization;
  if (!header) {
    if (context.unauthenticated === 'reject') throw unauthorized();
    return context.unauthenticated === 'admin' ? localAdmin : anonymousUser;
  }
  const m = header.match(/^Bearer\s+(.+)$/i);
  if (!m) throw unauthorized();
  const user = context.access.authenticate(m[1].trim());
  if (!user) throw unauthorized();
  return user;
}
