/** Public surface of the gateway package (the agent talks to it over the control socket, not by import). */
export type { GatewayServers } from './app.ts';
export { buildGateway, createGatewayDeps } from './app.ts';
export type { GatewayConfig } from './config.ts';
export { gatewaySettings, loadGatewayConfig } from './config.ts';
export { RegisterBodySchema } from './control.ts';

export type { RunningGateway } from './service.ts';
export { startGateway } from './service.ts';
